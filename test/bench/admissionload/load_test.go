package admissionload

import (
	"testing"
	"time"
)

// Smoke version: one second at 100 req/s against both targets; every request must be
// answered and allowed (the TP pod is pinned by nvdomain, passed by the no-op). As many may
// be in flight as are sent: what is checked is the answers, not how fast they come (under the
// race detector on a loaded 2-core machine p50 reaches half a second, which a smaller cap
// turned into dropped requests); the latency is `make bench-admission`'s to measure.
func TestSmokeLoad(t *testing.T) {
	targets, err := Targets(View(500, 2000))
	if err != nil {
		t.Fatal(err)
	}
	body, err := Review()
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		st := Run(tg, body, 100, time.Second, 100)
		tg.Close()
		t.Logf("%s: %d sent, %d errors, p50 %v p99 %v max %v", st.Target, st.Sent, st.Errors, st.P50, st.P99, st.Max)
		if st.Sent != 100 || st.Errors != 0 || st.Dropped != 0 {
			t.Errorf("%s: sent %d, errors %d (%s), dropped %d", st.Target, st.Sent, st.Errors, st.ErrSample, st.Dropped)
		}
	}
}
