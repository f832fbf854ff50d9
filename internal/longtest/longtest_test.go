package longtest_test

import (
	"testing"

	"github.com/seamguard/seamguard/internal/longtest"
)

func TestEnabled(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "no": false, "1": true, "true": true} {
		t.Setenv(longtest.Env, v)
		if got := longtest.Enabled(); got != want {
			t.Errorf("%s=%q: Enabled() = %v, want %v", longtest.Env, v, got, want)
		}
	}
}
