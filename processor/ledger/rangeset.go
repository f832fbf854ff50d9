package ledger

import (
	"slices"
	"sort"

	"github.com/seamguard/seamguard/events"
)

// Range is the half-open offset interval [Start, End).
type Range = events.Range

// RangeSet is a set of offsets kept as sorted, disjoint, non-adjacent, non-empty
// half-open ranges. The zero value is the empty set. Operations that combine a
// set with another look each range of the smaller side up in the larger one by
// binary search, so their cost is O(k log n + output) for k ranges against n.
//
// A RangeSet is a value with a slice inside: copy it with Clone before changing
// one of two copies. It is not safe for concurrent mutation.
type RangeSet struct {
	r []Range
}

// NewRangeSet returns the union of rs (in any order, overlapping or empty).
func NewRangeSet(rs ...Range) RangeSet {
	var s RangeSet
	for _, r := range rs {
		s.Add(r)
	}
	return s
}

// Ranges returns the ranges of s, sorted. The slice is shared: do not modify it.
func (s RangeSet) Ranges() []Range { return s.r }

// Len returns the number of ranges.
func (s RangeSet) Len() int { return len(s.r) }

// IsEmpty reports whether s holds no offset.
func (s RangeSet) IsEmpty() bool { return len(s.r) == 0 }

// Count returns the number of offsets in s.
func (s RangeSet) Count() uint64 {
	var n uint64
	for _, r := range s.r {
		n += r.End - r.Start
	}
	return n
}

// Clone returns a copy of s that shares no memory with it.
func (s RangeSet) Clone() RangeSet {
	if len(s.r) == 0 {
		return RangeSet{}
	}
	return RangeSet{r: slices.Clone(s.r)}
}

// Max returns the end of the last range, 0 for the empty set.
func (s RangeSet) Max() uint64 {
	if len(s.r) == 0 {
		return 0
	}
	return s.r[len(s.r)-1].End
}

// first returns the index of the first range whose End is greater than x: the
// first range that holds x or lies after it.
func (s RangeSet) first(x uint64) int {
	return sort.Search(len(s.r), func(i int) bool { return s.r[i].End > x })
}

// Has reports whether offset x is in s.
func (s RangeSet) Has(x uint64) bool {
	i := s.first(x)
	return i < len(s.r) && s.r[i].Start <= x
}

// Covers reports whether every offset of r is in s (true for an empty r).
func (s RangeSet) Covers(r Range) bool {
	if r.Empty() {
		return true
	}
	i := s.first(r.Start)
	return i < len(s.r) && s.r[i].Start <= r.Start && s.r[i].End >= r.End
}

// Overlaps reports whether some offset of r is in s.
func (s RangeSet) Overlaps(r Range) bool {
	if r.Empty() {
		return false
	}
	i := s.first(r.Start)
	return i < len(s.r) && s.r[i].Start < r.End
}

// SubsetOf reports whether every offset of s is in t.
func (s RangeSet) SubsetOf(t RangeSet) bool {
	for _, r := range s.r {
		if !t.Covers(r) {
			return false
		}
	}
	return true
}

// Equal reports whether s and t hold the same offsets.
func (s RangeSet) Equal(t RangeSet) bool { return slices.Equal(s.r, t.r) }

// Add inserts r into s, merging it with the ranges it overlaps or touches.
// Appending at the end, the common case, is amortised O(1).
func (s *RangeSet) Add(r Range) {
	if r.Empty() {
		return
	}
	n := len(s.r)
	if n == 0 || s.r[n-1].End < r.Start {
		s.r = append(s.r, r)
		return
	}
	// i: first range that touches or follows r (End >= r.Start).
	i := sort.Search(n, func(k int) bool { return s.r[k].End >= r.Start })
	// j: first range after i that lies strictly after r (Start > r.End).
	j := i + sort.Search(n-i, func(k int) bool { return s.r[i+k].Start > r.End })
	if i == j {
		s.r = slices.Insert(s.r, i, r)
		return
	}
	merged := Range{Start: min(r.Start, s.r[i].Start), End: max(r.End, s.r[j-1].End)}
	s.r[i] = merged
	s.r = slices.Delete(s.r, i+1, j)
}

// LenAfterAdd returns how many ranges s would hold after Add(r), without
// changing s: O(log n).
func (s RangeSet) LenAfterAdd(r Range) int {
	n := len(s.r)
	if r.Empty() {
		return n
	}
	i := sort.Search(n, func(k int) bool { return s.r[k].End >= r.Start })
	j := i + sort.Search(n-i, func(k int) bool { return s.r[i+k].Start > r.End })
	return n - (j - i) + 1
}

// overlapping returns how many ranges of s share an offset with r, in
// O(log n).
func (s RangeSet) overlapping(r Range) int {
	if r.Empty() {
		return 0
	}
	i := s.first(r.Start)
	return sort.Search(len(s.r)-i, func(k int) bool { return s.r[i+k].Start >= r.End })
}

// AddSet inserts every range of t into s.
func (s *RangeSet) AddSet(t RangeSet) {
	if len(t.r) == 0 {
		return
	}
	if len(s.r) == 0 {
		s.r = slices.Clone(t.r)
		return
	}
	if len(t.r) > len(s.r) {
		*s = Union(*s, t)
		return
	}
	for _, r := range t.r {
		s.Add(r)
	}
}

// Union returns s ∪ t as a new set.
func Union(s, t RangeSet) RangeSet {
	if len(s.r) == 0 {
		return t.Clone()
	}
	if len(t.r) == 0 {
		return s.Clone()
	}
	out := make([]Range, 0, len(s.r)+len(t.r))
	i, j := 0, 0
	push := func(r Range) {
		if n := len(out); n > 0 && out[n-1].End >= r.Start {
			out[n-1].End = max(out[n-1].End, r.End)
			return
		}
		out = append(out, r)
	}
	for i < len(s.r) || j < len(t.r) {
		if j == len(t.r) || (i < len(s.r) && s.r[i].Start <= t.r[j].Start) {
			push(s.r[i])
			i++
		} else {
			push(t.r[j])
			j++
		}
	}
	return RangeSet{r: out}
}

// Intersect returns s ∩ t as a new set. It walks the smaller set and looks up
// the larger one: O(k log n + output).
func Intersect(s, t RangeSet) RangeSet {
	if len(s.r) > len(t.r) {
		s, t = t, s
	}
	var out []Range
	for _, a := range s.r {
		out = t.appendWithin(out, a)
	}
	return RangeSet{r: out}
}

// appendWithin appends the pieces of s inside a, in order.
func (s RangeSet) appendWithin(out []Range, a Range) []Range {
	for i := s.first(a.Start); i < len(s.r) && s.r[i].Start < a.End; i++ {
		out = append(out, Range{Start: max(a.Start, s.r[i].Start), End: min(a.End, s.r[i].End)})
	}
	return out
}

// Within returns s ∩ r as a new set, in O(log n + output).
func (s RangeSet) Within(r Range) RangeSet {
	if r.Empty() {
		return RangeSet{}
	}
	return RangeSet{r: s.appendWithin(nil, r)}
}

// Diff returns s \ t as a new set: for each range of s the pieces of t inside
// it are looked up by binary search, O(k log n + output) for k ranges in s.
func Diff(s, t RangeSet) RangeSet {
	var out []Range
	for _, a := range s.r {
		out = t.appendGaps(out, a)
	}
	return RangeSet{r: out}
}

// RangeDiff returns r \ t as a new set, in O(log n + output).
func RangeDiff(r Range, t RangeSet) RangeSet {
	if r.Empty() {
		return RangeSet{}
	}
	return RangeSet{r: t.appendGaps(nil, r)}
}

// appendGaps appends the pieces of a that are not in s, in order.
func (s RangeSet) appendGaps(out []Range, a Range) []Range {
	cur := a.Start
	for i := s.first(a.Start); i < len(s.r) && s.r[i].Start < a.End; i++ {
		if s.r[i].Start > cur {
			out = append(out, Range{Start: cur, End: s.r[i].Start})
		}
		cur = s.r[i].End
	}
	if cur < a.End {
		out = append(out, Range{Start: cur, End: a.End})
	}
	return out
}
