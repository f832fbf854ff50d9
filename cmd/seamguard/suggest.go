package main

import (
	"flag"
	"slices"
	"strings"
)

// suggest returns the candidates closest to typed, a mistyped command or
// flag name: those at the smallest edit distance (insertions, deletions,
// substitutions and swaps of two neighbours), if it is small for the length
// of typed, or else those typed is the start of. Case is ignored. It
// returns nil when nothing is close, or when too many are.
func suggest(typed string, candidates []string) []string {
	t := strings.ToLower(typed)
	if t == "" {
		return nil
	}
	limit := max(1, min(3, len(t)/3))
	best, bestD := []string(nil), limit+1
	for _, c := range candidates {
		d := editDistance(t, strings.ToLower(c))
		switch {
		case d < bestD:
			best, bestD = []string{c}, d
		case d == bestD:
			best = append(best, c)
		}
	}
	if len(best) == 0 && len(t) >= 2 {
		for _, c := range candidates {
			if strings.HasPrefix(strings.ToLower(c), t) {
				best = append(best, c)
			}
		}
	}
	if len(best) > 3 {
		return nil
	}
	slices.Sort(best)
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// the insertions, deletions, substitutions and transpositions of adjacent
// bytes that turn one into the other, no substring edited twice.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// didYouMean is "; did you mean X?" (or "X or Y?") for the suggestions, each
// shown by show, or "" when there is none.
func didYouMean(suggestions []string, show func(string) string) string {
	if len(suggestions) == 0 {
		return ""
	}
	shown := make([]string, len(suggestions))
	for i, s := range suggestions {
		shown[i] = show(s)
	}
	last := shown[len(shown)-1]
	if len(shown) == 1 {
		return "; did you mean " + last + "?"
	}
	return "; did you mean " + strings.Join(shown[:len(shown)-1], ", ") + " or " + last + "?"
}

// flagSpelling is how a flag is written on the command line: -o for a
// one-letter name, --name for the others.
func flagSpelling(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// undefinedFlagPrefix starts the error of package flag for a flag that fs
// does not define; the name follows, after its dash.
const undefinedFlagPrefix = "flag provided but not defined: -"

// flagSuggestion is "; did you mean --xyz?" for err, the error of fs.Parse,
// when it is about a flag fs does not define and one of fs's is close to
// it; or "".
func flagSuggestion(fs *flag.FlagSet, err error) string {
	typed, ok := strings.CutPrefix(err.Error(), undefinedFlagPrefix)
	if !ok {
		return ""
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return didYouMean(suggest(typed, names), flagSpelling)
}
