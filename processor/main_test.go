package processor_test

import (
	"os"
	"testing"

	"github.com/seamguard/seamguard/processor"
)

// TestMain runs every test of the package with the partitions' floors
// written with every group of states, however small, so that the whole
// suite (hand-overs, crashes, zombies, lost states) runs with sessions read
// fresh taken as caught up on a floor's word wherever one shows it; the
// processor writes them only with groups large enough for an atomic batch.
func TestMain(m *testing.M) {
	processor.FloorsOnEveryGroup()
	os.Exit(m.Run())
}
