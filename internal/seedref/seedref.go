package seedref

import (
	"fmt"

	"github.com/seamguard/seamguard/events"
)

// Check returns "" when the classic check lets a compaction run, and
// otherwise names the test that stops it. It keeps every prior truncation
// and scans them all on every request. Offsets are signed, as the check
// has them: the floor's start is tail_start minus the span and may go below
// zero.
func Check(inputStart, tailStart, span int64, prior []events.Range, floorUnit, truncatorUnit events.Unit) string {
	if floorUnit != truncatorUnit {
		return fmt.Sprintf("unit: the floor counts %s, the truncator evicts %s", floorUnit, truncatorUnit)
	}
	floorStart := tailStart - span
	if inputStart > floorStart {
		return fmt.Sprintf("input-start: the summarizer's input starts at %d, after the floor's start %d", inputStart, floorStart)
	}
	for _, t := range prior {
		if int64(t.End) > floorStart && int64(t.Start) < tailStart {
			return fmt.Sprintf("prior truncation [%d, %d) meets the floor's reach [%d, %d)", t.Start, t.End, floorStart, tailStart)
		}
	}
	return ""
}
