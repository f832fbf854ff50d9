package main

import (
	"bufio"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repoRoot is the repository's root; tests run in cmd/seamguard.
var repoRoot = filepath.Join("..", "..")

// markdownFiles returns every *.md file of the repository, relative to its
// root, but those under node_modules, .git and testdata.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", ".git", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(repoRoot, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	require.NoError(t, err)
	return files
}

// mdLine is a line of a markdown file outside fenced code blocks.
type mdLine struct {
	n    int    // 1-based line number
	text string // as written
}

// markdownLines reads file and returns its lines outside fenced code
// blocks, and its headings' texts in order.
func markdownLines(t *testing.T, file string) (lines []mdLine, headings []mdHeading) {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, file))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	fence := ""
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				fence = ""
			}
			continue
		}
		if m := fenceRE.FindString(trimmed); m != "" {
			fence = m
			continue
		}
		lines = append(lines, mdLine{n: n, text: line})
		if m := headingRE.FindStringSubmatch(line); m != nil {
			headings = append(headings, mdHeading{level: len(m[1]), text: strings.TrimSpace(strings.TrimRight(m[2], "# ")), line: n})
		}
	}
	require.NoError(t, sc.Err())
	return lines, headings
}

type mdHeading struct {
	level int
	text  string
	line  int
}

var (
	fenceRE   = regexp.MustCompile("^(```+|~~~+)")
	headingRE = regexp.MustCompile(`^(#{1,6})\s+(.*)$`)
	// linkRE matches an inline link or image, [text](target) or
	// [text](target "title"); the text may hold one level of brackets.
	linkRE = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?(?:\s+"[^"]*")?\s*\)`)
	// codeLinkRE finds what reads as a link inside inline code.
	codeLinkRE = regexp.MustCompile(`\[[^\[\]]+\]\([^()\s]+\)`)
	// Inline HTML links.
	hrefRE = regexp.MustCompile(`<a\s[^>]*href="([^"]*)"`)
)

// splitCode splits a line into its text outside inline code, with each
// code span blanked out, and the code spans' contents (CommonMark: a run
// of n backticks opens a span that the next run of exactly n closes).
func splitCode(line string) (outside string, spans []string) {
	var b strings.Builder
	for i := 0; i < len(line); {
		if line[i] == '\\' && i+1 < len(line) {
			b.WriteString(line[i : i+2])
			i += 2
			continue
		}
		if line[i] != '`' {
			b.WriteByte(line[i])
			i++
			continue
		}
		j := i
		for j < len(line) && line[j] == '`' {
			j++
		}
		run := j - i
		// Find the closing run of the same length.
		end := -1
		for k := j; k < len(line); {
			if line[k] != '`' {
				k++
				continue
			}
			l := k
			for l < len(line) && line[l] == '`' {
				l++
			}
			if l-k == run {
				end = k
				break
			}
			k = l
		}
		if end < 0 { // no closing run: the backticks are literal
			b.WriteString(line[i:j])
			i = j
			continue
		}
		spans = append(spans, line[j:end])
		b.WriteString(strings.Repeat("x", end+run-i)) // keeps positions, holds no brackets
		i = end + run
	}
	return b.String(), spans
}

// githubSlug is the anchor GitHub gives a heading: its text as rendered
// (inline code and emphasis marks dropped, a link's text kept), lower
// case, every character but letters, digits, spaces, '-' and '_' removed,
// spaces made '-'.
func githubSlug(heading string) string {
	heading = linkRE.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a file's headings, numbered as GitHub
// numbers repeated ones (-1, -2, ...).
func anchors(headings []mdHeading) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, h := range headings {
		s := githubSlug(h.text)
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// mdPage is a markdown page as TestDocsLinks reads it.
type mdPage struct {
	lines    []mdLine
	headings []mdHeading
	anchors  map[string]bool
}

// TestDocsLinks walks every markdown page of the repository: every relative
// link must name a file or directory that exists, and a link to a heading
// (#anchor) a heading that the target page has; no link may be written
// inside inline code, where it does not render as one; and no page may
// repeat its title as a heading below it.
func TestDocsLinks(t *testing.T) {
	files := markdownFiles(t)
	require.Contains(t, files, "README.md")
	require.Contains(t, files, "docs/operating.md")

	pages := map[string]*mdPage{}
	load := func(file string) *mdPage {
		if p, ok := pages[file]; ok {
			return p
		}
		lines, headings := markdownLines(t, file)
		p := &mdPage{lines: lines, headings: headings, anchors: anchors(headings)}
		pages[file] = p
		return p
	}

	links := 0
	for _, file := range files {
		p := load(file)
		// The title, repeated as a heading below it.
		if len(p.headings) > 0 {
			title := p.headings[0]
			for _, h := range p.headings[1:] {
				if strings.EqualFold(h.text, title.text) {
					t.Errorf("%s:%d: the heading %q repeats the page's title (line %d)", file, h.line, h.text, title.line)
				}
			}
		}
		for _, l := range p.lines {
			outside, spans := splitCode(l.text)
			for _, s := range spans {
				if m := codeLinkRE.FindString(s); m != "" {
					t.Errorf("%s:%d: the link %s is written inside inline code, where it does not render as a link", file, l.n, m)
				}
			}
			var targets []string
			for _, m := range linkRE.FindAllStringSubmatchIndex(outside, -1) {
				targets = append(targets, l.text[m[4]:m[5]])
			}
			for _, m := range hrefRE.FindAllStringSubmatch(outside, -1) {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				links++
				if msg := checkLink(file, target, load); msg != "" {
					t.Errorf("%s:%d: link %s: %s", file, l.n, target, msg)
				}
			}
		}
	}
	assert.Greater(t, links, 30, "the walk found the pages' links")
}

// checkLink says what is wrong with a link target written in file, or ""
// when nothing is: a link with a scheme (https:, mailto:) is not checked; a
// relative one must name a file or directory inside the repository, and
// its #anchor, if any, a heading of the markdown page it names.
func checkLink(file, target string, load func(string) *mdPage) string {
	if target == "" {
		return "empty target"
	}
	u, err := url.Parse(target)
	if err != nil {
		return err.Error()
	}
	if u.Scheme != "" || u.Host != "" {
		return ""
	}
	path, err := url.PathUnescape(u.Path)
	if err != nil {
		return err.Error()
	}
	dest := file
	if path != "" {
		if strings.HasPrefix(path, "/") {
			return "an absolute path: write it relative to " + file
		}
		dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(file), path)))
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "it leads out of the repository"
		}
		if _, err := os.Stat(filepath.Join(repoRoot, dest)); err != nil {
			return fmt.Sprintf("%s does not exist (relative to %s, it is %s)", path, filepath.Dir(file), dest)
		}
	}
	if u.Fragment == "" {
		return ""
	}
	if !strings.HasSuffix(dest, ".md") {
		return "" // an anchor into a file that is not markdown: a line, say
	}
	if !load(dest).anchors[u.Fragment] {
		return fmt.Sprintf("%s has no heading whose anchor is #%s", dest, u.Fragment)
	}
	return ""
}

// TestGithubSlug: anchors as GitHub makes them.
func TestGithubSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Running it: `seamguard serve`":           "running-it-seamguard-serve",
		"Rebuilding: `serve --rebuild`":           "rebuilding-serve---rebuild",
		"Durability: what a power cut keeps":      "durability-what-a-power-cut-keeps",
		"Inputs (types start `io.seamguard.`)":    "inputs-types-start-ioseamguard",
		"One serve per data directory":            "one-serve-per-data-directory",
		"`seamguard inspect SESSION`":             "seamguard-inspect-session",
		"See [the contract](contract.md), rule 4": "see-the-contract-rule-4",
	} {
		assert.Equal(t, want, githubSlug(heading), heading)
	}
	assert.True(t, anchors([]mdHeading{{text: "A"}, {text: "a"}, {text: "A"}})["a-2"])
	outside, spans := splitCode("see `[x](y)` and ``a ` b`` [z](w)")
	assert.Equal(t, []string{"[x](y)", "a ` b"}, spans)
	assert.NotContains(t, outside, "[x](y)")
	assert.Contains(t, outside, "[z](w)")
}

// TestServeFlagsDocumented: every flag of serve is in the flag table of
// docs/operating.md.
func TestServeFlagsDocumented(t *testing.T) {
	code, help, stderr := runCLI(t, "", "serve", "-h")
	require.Equal(t, 0, code, stderr)
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(help, -1) {
		flags = append(flags, m[1])
	}
	require.Contains(t, flags, "connect-timeout")
	require.Greater(t, len(flags), 30)
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operating.md"))
	require.NoError(t, err)
	var table strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| `--") {
			first, _, _ := strings.Cut(line[1:], "|") // the flag column
			table.WriteString(first)
		}
	}
	for _, f := range flags {
		assert.Contains(t, table.String(), "`--"+f+"`", "serve's flag --%s is not in the flag table of docs/operating.md", f)
	}
}
