package main

import (
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSuggest: the names suggested for a mistyped one, and the edit
// distance behind them.
func TestSuggest(t *testing.T) {
	names := commandNames()
	for _, tc := range []struct {
		typed string
		want  []string
	}{
		{"serv", []string{"serve"}},
		{"sreve", []string{"serve"}},
		{"Serve", []string{"serve"}},
		{"pubilsh", []string{"publish"}},
		{"insp", []string{"inspect"}},
		{"rep", []string{"replay"}},
		{"wtach", []string{"watch"}},
		{"versoin", []string{"version"}},
		{"nope", nil},
		{"x", nil},
		{"", nil},
		{"compact", nil},
	} {
		assert.Equal(t, tc.want, suggest(tc.typed, names), "%q", tc.typed)
	}
	assert.Equal(t, []string{"a", "b"}, suggest("c", []string{"b", "a", "long"}), "ties are all named, sorted")
	assert.Nil(t, suggest("e", []string{"a", "b", "c", "d"}), "too many to be of help")

	for _, tc := range []struct {
		a, b string
		d    int
	}{
		{"", "", 0}, {"a", "", 1}, {"", "abc", 3}, {"serve", "serve", 0}, {"serv", "serve", 1},
		{"sreve", "serve", 1}, {"timeout", "tiemout", 1}, {"kitten", "sitting", 3}, {"ca", "abc", 3},
	} {
		assert.Equal(t, tc.d, editDistance(tc.a, tc.b), "%q %q", tc.a, tc.b)
		assert.Equal(t, tc.d, editDistance(tc.b, tc.a), "%q %q", tc.b, tc.a)
	}
}

// TestDidYouMean: a mistyped command, or a mistyped flag of any command,
// is a usage error (exit 2) that names the closest command or flag.
func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serv"}, `seamguard: unknown command "serv"; did you mean serve?`},
		{[]string{"inpsect", "s"}, `unknown command "inpsect"; did you mean inspect?`},
		{[]string{"help", "serv"}, `no command "serv"; did you mean serve? The commands are bench,`},
		{[]string{"publish", "--wiat", "f.jsonl"}, "flag provided but not defined: -wiat; did you mean --wait?"},
		{[]string{"resume", "s", "--nte", "x"}, "flag provided but not defined: -nte; did you mean --note?"},
		{[]string{"spill", "get", "x/1.jsonl", "--onyl"}, "did you mean --only?"},
		{[]string{"spill", "get", "x/1.jsonl", "-0", "f"}, "did you mean -o?"},
		{[]string{"inspect", "s", "--JSON"}, "did you mean --json?"},
		{[]string{"serve", "--park-afer", "1m"}, "did you mean --park-after?"},
		{[]string{"watch", "--nats-ulr", "nats://x"}, "did you mean --nats-url?"},
		{[]string{"spill", "gte", "x/1.jsonl"}, `spill has no subcommand "gte"; did you mean spill get?`},
	} {
		code, out, errs := runCLI(t, "", tc.args...)
		assert.Equal(t, 2, code, "%v: %s", tc.args, errs)
		assert.Empty(t, out, "%v", tc.args)
		assert.Contains(t, errs, tc.want, "%v", tc.args)
	}
	// Nothing close: no guess.
	code, _, errs := runCLI(t, "", "watch", "--nope")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "flag provided but not defined: -nope\n")
	assert.NotContains(t, errs, "did you mean")
	code, _, errs = runCLI(t, "", "frobnicate")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, `unknown command "frobnicate"`+"\n")
	assert.NotContains(t, errs, "did you mean")
}

// TestDidYouMeanEveryCommand: every command's flags are suggested, from
// the one place flags are parsed: each command's longest flag, read from
// its help, with two of its letters swapped, is named back. A command
// without flags (version) has nothing to suggest.
func TestDidYouMeanEveryCommand(t *testing.T) {
	entry := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)
	for _, name := range commandNames() {
		code, help, errs := runCLI(t, "", name, "-h")
		require.Equal(t, 0, code, errs)
		var flags []string
		for _, m := range entry.FindAllStringSubmatch(help, -1) {
			flags = append(flags, m[1])
		}
		if len(flags) == 0 {
			continue // version has none
		}
		sort.SliceStable(flags, func(i, j int) bool { return len(flags[i]) > len(flags[j]) })
		flag := flags[0]
		i := 2
		for flag[i] == flag[i+1] {
			i++
		}
		typo := flag[:i] + flag[i+1:i+2] + flag[i:i+1] + flag[i+2:]
		require.NotEqual(t, flag, typo)
		args := []string{name, "--" + typo}
		if name == "spill" {
			args = []string{"spill", "get", "--" + typo}
		}
		code, _, errs = runCLI(t, "", args...)
		assert.Equal(t, 2, code, "%v: %s", args, errs)
		assert.Regexp(t, `flag provided but not defined: -`+regexp.QuoteMeta(typo)+`; did you mean (\S+, )*(\S+ or )?--`+regexp.QuoteMeta(flag)+`[ ,?]`, errs, "%v", args)
		assert.Contains(t, errs, "run 'seamguard "+name+" -h' for its flags", "%v", args)
		assert.True(t, strings.HasPrefix(errs, "seamguard "+name+": usage: "), "%v: %s", args, errs)
	}
}
