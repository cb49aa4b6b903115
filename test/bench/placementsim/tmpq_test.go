package placementsim

import (
	"os"
	"testing"
)

func TestTmpQuick(t *testing.T) {
	if os.Getenv("TMPQ") == "" {
		t.Skip()
	}
	for _, sc := range Scenarios() {
		horizon := 2000 * 512 / float64(sc.GPUs())
		jobs, err := sc.Trace(20261129, 0.95, horizon)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []Policy{&DRAShipped{Hints: true}} {
			r := Run(p, sc.Nodes, jobs, horizon, horizon/10, 1)
			t.Logf("%-30s %-40s util %.3f TPwait %.2f stranded %.1f%% never %d", sc.Name, r.Policy, r.Utilisation, r.TPMeanWait, r.StrandedPct, r.NeverPlaced)
		}
	}
}
