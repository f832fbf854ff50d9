// Package termtext makes text that came from the wire safe to print on an
// operator's terminal.
//
// Request ids, event ids, sources, field names and messages are chosen by
// agents (or by whoever can publish an event). Printed raw, a request id
// holding ESC [ 2 J clears the operator's screen, an OSC sequence sets the
// window title or writes to the clipboard, a CR overwrites what the line
// said, and a bidi override reorders what the operator reads. Escape
// replaces every such character with a visible escape (\x1b, \u202e), and
// JSON does the same inside the strings of a JSON document, which stays
// valid and equal in meaning.
//
// Every function here is pure and safe for concurrent use.
package termtext
