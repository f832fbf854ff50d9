package read

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/spill"
)

// Spill serves GET (and HEAD) /v1/sessions/{session}/spills/{n}: the whole
// chain of spill <session>/<n>.jsonl, oldest spill first, as `seamguard
// spill get` writes it. n is the spill's number, as in the handle's name
// (3, or 3.jsonl).
//
// Answers: 200 with Content-Type application/jsonl, Content-Length, and
// the SHA-256 of the body in Digest (the spill handle's format,
// "SHA-256=" and URL-safe base64) and Repr-Digest (RFC 9530,
// "sha-256=:<base64>:"); 400 for a session id or number that is not
// well-formed; what Access says (401, 403) for a caller who may not read
// the session; 404 for a session without that spill; 500 for a spill or
// chain that does not verify; 503 when JetStream does not answer or too
// many spills are read at once.
func (h *Handler) Spill(w http.ResponseWriter, r *http.Request) {
	session, num := r.PathValue("session"), r.PathValue("n")
	if !events.ValidSessionID(session) {
		problem(w, http.StatusBadRequest, fmt.Sprintf("%q is not a session id: use 1 to 128 of the characters A-Z, a-z, 0-9, '_' and '-'", events.Excerpt(session)))
		return
	}
	n, ok := spillNumber(num)
	if !ok {
		problem(w, http.StatusBadRequest, fmt.Sprintf("%q is not a spill number: use the number of the spill's name, as in <session>/3.jsonl (3, or 3.jsonl)", events.Excerpt(num)))
		return
	}
	if err := h.access.Session(r, session); err != nil {
		deny(w, err)
		return
	}
	if !acquire(w, h.spillReads, "spill reads") {
		return
	}
	defer func() { <-h.spillReads }()
	ctx := r.Context()
	// Built from validated parts only: the session's own spill namespace.
	name := session + "/" + strconv.FormatUint(n, 10) + ".jsonl"

	info, err := h.store.Info(ctx, name)
	if err != nil {
		h.failure(w, r, name, err)
		return
	}
	if info.Opts != nil && info.Opts.Link != nil || spill.SessionOf(info) != session {
		problem(w, http.StatusNotFound, fmt.Sprintf("%s in bucket %s is not a spill seamguard wrote for session %s", name, h.names.Spills, session))
		return
	}
	chain, err := h.store.Chain(ctx, name)
	if err != nil {
		h.failure(w, r, name, err)
		return
	}
	var size uint64
	for _, c := range chain {
		if !strings.HasPrefix(c.Name, session+"/") {
			h.failure(w, r, name, fmt.Errorf("%w: %s names %s, not a spill of session %s, in its chain", spill.ErrChain, name, events.Excerpt(c.Name), session))
			return
		}
		size += c.Size
	}
	key := chainKey(chain)
	sum, ok := h.cachedDigest(key)
	if !ok {
		hs := sha256.New()
		read, err := h.store.GetChain(ctx, name, hs)
		if err == nil && chainKey(read) != key {
			err = fmt.Errorf("%w: the chain of %s changed while it was read", errChanged, name)
		}
		if err != nil {
			h.failure(w, r, name, err)
			return
		}
		sum = hs.Sum(nil)
		h.keepDigest(key, sum)
	}

	hd := w.Header()
	hd.Set("Content-Type", ContentTypeJSONLines)
	hd.Set("Content-Length", strconv.FormatUint(size, 10))
	hd.Set("Digest", "SHA-256="+base64.URLEncoding.EncodeToString(sum))
	hd.Set("Repr-Digest", "sha-256=:"+base64.StdEncoding.EncodeToString(sum)+":")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Content-Type-Options", "nosniff")
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		return
	}
	rc := http.NewResponseController(w)
	out := &bodyWriter{w: w, h: sha256.New(), deadline: func() { h.writeDeadline(rc) }}
	read, err := h.store.GetChain(ctx, name, out)
	if err == nil && (chainKey(read) != key || out.n != size || string(out.h.Sum(nil)) != string(sum)) {
		h.forgetDigest(key)
		err = fmt.Errorf("%w: the chain of %s read back %d bytes with another digest or chain than the headers announce", errChanged, name, out.n)
	}
	switch {
	case err == nil:
	case out.n == 0 && out.err == nil:
		h.failure(w, r, name, err) // nothing sent yet: the status can still say it
	default:
		if ctx.Err() == nil && out.err == nil {
			h.log.Error("read: spill answer aborted after part of its body", "spill", name, "sent", out.n, "size", size, "err", err)
		}
		// The status and headers are sent: only a short body can say it.
		panic(http.ErrAbortHandler)
	}
}

// errChanged is a spill chain that changed between two reads.
var errChanged = errors.New("read: spill changed")

// spillNumber parses the {n} of a spill path: a decimal number from 1, as
// ledger names spills, with or without ".jsonl", and nothing else (no
// sign, no leading zero).
func spillNumber(s string) (uint64, bool) {
	s = strings.TrimSuffix(s, ".jsonl")
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != s {
		return 0, false
	}
	return n, true
}

// failure answers an error of reading spill name.
func (h *Handler) failure(w http.ResponseWriter, r *http.Request, name string, err error) {
	switch {
	case r.Context().Err() != nil:
		// The client went away: no one reads the answer.
		w.WriteHeader(http.StatusServiceUnavailable)
	case errors.Is(err, jetstream.ErrObjectNotFound) && !errors.Is(err, spill.ErrChain),
		errors.Is(err, jetstream.ErrObjectNotFound) && errors.Is(err, errChanged),
		errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		// No bucket yet: no spill was ever written.
		session, _, _ := strings.Cut(name, "/")
		problem(w, http.StatusNotFound, fmt.Sprintf("session %s has no spill %s in bucket %s; spill names are in the transcript.spilled and compaction.refused verdicts", session, name, h.names.Spills))
	case errors.Is(err, errChanged):
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, err.Error()+"; ask again")
	case errors.Is(err, spill.ErrChain), errors.Is(err, spill.ErrDigestMismatch):
		h.log.Error("read: spill does not verify", "spill", name, "err", err)
		problem(w, http.StatusInternalServerError, fmt.Sprintf("spill %s cannot be served whole: %v", name, err))
	case unreachable(err):
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, fmt.Sprintf("JetStream did not answer while reading %s; ask again", name))
	default:
		h.log.Error("read: spill read failed", "spill", name, "err", err)
		problem(w, http.StatusInternalServerError, fmt.Sprintf("reading spill %s failed", name))
	}
}

// unreachable reports whether err says that JetStream did not answer,
// rather than answered no.
func unreachable(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, spill.ErrUnavailable)
}

// bodyWriter writes a spill's bytes to the client, each write within the
// write timeout, and hashes what it wrote.
type bodyWriter struct {
	w        http.ResponseWriter
	h        hash.Hash
	deadline func()
	n        uint64
	err      error
}

func (b *bodyWriter) Write(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	b.deadline()
	n, err := b.w.Write(p)
	b.h.Write(p[:n])
	b.n += uint64(n)
	if err != nil {
		b.err = err
	}
	return n, err
}

// chainKey identifies the bytes of a chain: the name, size and digest of
// each of its spills, oldest first.
func chainKey(chain []events.SpillHandle) string {
	var b strings.Builder
	for _, c := range chain {
		fmt.Fprintf(&b, "%s\x00%d\x00%s\x00", c.Name, c.Size, c.Digest)
	}
	return b.String()
}

func (h *Handler) cachedDigest(key string) ([]byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.digests[key]
	return []byte(d), ok
}

// keepDigest remembers a chain's digest; when the cache is full, an
// arbitrary entry makes room.
func (h *Handler) keepDigest(key string, sum []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.digests) >= orDefault(h.cfg.DigestCache, DefaultDigestCache) {
		for k := range h.digests {
			delete(h.digests, k)
			break
		}
	}
	h.digests[key] = string(sum)
}

func (h *Handler) forgetDigest(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.digests, key)
}
