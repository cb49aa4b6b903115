package admissionload

import (
	"testing"
	"time"
)

// Smoke version: one second at 100 req/s against both targets; every request must be
// answered and allowed (the TP pod is pinned by nvdomain, passed by the no-op).
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
		st := Run(tg, body, 100, time.Second, 64)
		tg.Close()
		t.Logf("%s: %d sent, %d errors, p50 %v p99 %v max %v", st.Target, st.Sent, st.Errors, st.P50, st.P99, st.Max)
		if st.Sent != 100 || st.Errors != 0 || st.Dropped != 0 {
			t.Errorf("%s: sent %d, errors %d (%s), dropped %d", st.Target, st.Sent, st.Errors, st.ErrSample, st.Dropped)
		}
	}
}
