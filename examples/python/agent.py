#!/usr/bin/env python3
"""An agent that plays the seed story against seamguard over HTTP, with the
standard library alone.

    seamguard serve --http-listen 127.0.0.1:8080
    python3 examples/python/agent.py --url http://127.0.0.1:8080

It publishes each event of testdata/stories/seed-story.jsonl with
POST /v1/events (binary mode by default: attributes in percent-encoded ce-*
headers, the data as the body; --mode structured sends the whole event as
application/cloudevents+json), and each compaction request with ?wait=10s,
which answers with the verdict itself (contract section 9, "CloudEvents over
HTTP"). The story's first compaction would drop the turns a budget step
evicted (the rule "Do not touch anything under /etc." among them), so
seamguard refuses it and spills the transcript. The agent then reads the spill
with GET /v1/sessions/{session}/spills/{n}, checks that every at-risk turn it
sent, the evicted rule included, is in it, and sends the compaction again,
which is allowed. It exits 0 when the story went that way, 1 otherwise, and
says what happened.

Each run uses a session of its own (--session, default ops-agent-42-<random>),
with event ids to match, so it can be run again against the same server. A
bearer token (--token, or SEAMGUARD_TOKEN) goes in the Authorization header.
"""
import argparse
import json
import os
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request

STORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testdata", "stories", "seed-story.jsonl")


def quote(value):
    """Percent-encodes a header value as the CloudEvents HTTP binding asks:
    everything but printable ASCII other than space, '"' and '%'."""
    out = []
    for b in str(value).encode("utf-8"):
        c = chr(b)
        if b <= 0x20 or b > 0x7E or c in '"%':
            out.append("%%%02X" % b)
        else:
            out.append(c)
    return "".join(out)


class Gateway:
    def __init__(self, url, token, mode):
        self.url = url.rstrip("/")
        self.token = token
        self.mode = mode

    def request(self, method, path, body=None, headers=None):
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, timeout=70) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()
        except (urllib.error.URLError, OSError) as e:
            raise SystemExit(fail("%s %s: %s; is seamguard serve --http-listen running there?" % (method, self.url + path, e)))

    def post_event(self, event, wait=None):
        path = "/v1/events"
        if wait:
            path += "?wait=" + urllib.parse.quote(wait)
        if self.mode == "structured":
            body = json.dumps(event).encode()
            headers = {"Content-Type": "application/cloudevents+json"}
        else:
            headers = {"Content-Type": event.get("datacontenttype", "application/json")}
            for k, v in event.items():
                if k not in ("data", "datacontenttype", "data_base64"):
                    headers["ce-" + k] = quote(v)
            body = json.dumps(event.get("data", {})).encode()
        return self.request("POST", path, body, headers)


def load_story(path, session):
    """The story's events, with the session and ids renamed for this run."""
    events = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            ev = json.loads(line)
            old = ev["subject"]
            ev["subject"] = session
            ev["id"] = ev["id"].replace(old, session, 1)
            events.append(ev)
    return events


def fail(msg):
    print("agent: " + msg, file=sys.stderr, flush=True)
    return 1


def verdict_of(status, body):
    """The verdict a ?wait request answered with (a structured CloudEvent), or None."""
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def main():
    ap = argparse.ArgumentParser(description="play the seed story over seamguard's HTTP gateway")
    ap.add_argument("--url", default=os.environ.get("SEAMGUARD_HTTP_URL", "http://127.0.0.1:8080"), help="the gateway, serve --http-listen")
    ap.add_argument("--token", default=os.environ.get("SEAMGUARD_TOKEN", ""), help="bearer token (default $SEAMGUARD_TOKEN)")
    ap.add_argument("--mode", choices=["binary", "structured"], default="binary")
    ap.add_argument("--session", default="ops-agent-42-" + secrets.token_hex(3))
    ap.add_argument("--story", default=STORY)
    ap.add_argument("--wait", default="10s", help="how long a compaction request waits for its verdict")
    args = ap.parse_args()

    gw = Gateway(args.url, args.token, args.mode)
    events = load_story(args.story, args.session)
    turns = {}  # offset -> the turn.appended event
    refused = None
    for ev in events:
        kind = ev["type"].rsplit(".", 2)[-2] + "." + ev["type"].rsplit(".", 1)[-1]
        if ev["type"] == "io.seamguard.turn.appended":
            d = ev["data"]
            for off in range(d["offset"], d["offset"] + d["size"]):
                turns[off] = ev
        if ev["type"] != "io.seamguard.compaction.requested":
            status, _, body = gw.post_event(ev)
            if status != 202:
                return fail("POST %s %s: %d %s" % (kind, ev["id"], status, body.decode(errors="replace")))
            continue

        status, headers, body = gw.post_event(ev, wait=args.wait)
        if status == 202:
            return fail("compaction %s: not decided within %s" % (ev["data"]["request_id"], args.wait))
        verdict = verdict_of(status, body)
        if verdict is None:
            return fail("compaction %s: %d %s" % (ev["data"]["request_id"], status, body.decode(errors="replace")))
        vtype, data = verdict["type"], verdict.get("data") or {}
        print("%s: %s" % (ev["data"]["request_id"], vtype), flush=True)

        if refused is None:
            # The first request drops the turns a budget step evicted: refused, spilled.
            if vtype != "io.seamguard.compaction.refused":
                return fail("the first compaction was not refused: %s" % vtype)
            refused = data
            spill = data.get("spill")
            if not spill:
                return fail("the refusal names no spill")
            n = spill["name"].rsplit("/", 1)[-1].split(".", 1)[0]
            status, headers, body = gw.request("GET", "/v1/sessions/%s/spills/%s" % (urllib.parse.quote(args.session), n))
            if status != 200:
                return fail("GET spill %s: %d %s" % (spill["name"], status, body.decode(errors="replace")))
            spilled = [json.loads(l) for l in body.decode().splitlines() if l.strip()]
            ids = {e.get("id") for e in spilled}
            at_risk = [(r["start"], r["end"]) for reason in data.get("reasons") or [] for r in reason.get("at_risk") or []]
            missing, rules = [], []
            for start, end in at_risk:
                for off in range(start, end):
                    t = turns.get(off)
                    if t is None:
                        continue
                    if t["id"] not in ids:
                        missing.append(off)
                    elif t["data"].get("role") == "user" and isinstance(t["data"].get("content"), str):
                        rules.append("turn %d: %s" % (off, t["data"]["content"]))
            if missing:
                return fail("the spill lacks at-risk turns %s" % missing)
            if not any("/etc" in r for r in rules):
                return fail("the evicted rule about /etc is not among the at-risk turns the spill holds")
            print("spill %s holds the %d at-risk turn(s) (digest %s); the at-risk user turns, the evicted rule among them:" % (spill["name"], sum(e - s for s, e in at_risk), headers.get("Digest", "?")), flush=True)
            for r in rules:
                print("  " + r, flush=True)
        elif vtype != "io.seamguard.compaction.allowed":
            return fail("the retry was not allowed: %s %s" % (vtype, json.dumps(data)))
        else:
            print("allowed: recovered by %s" % ", ".join(h.get("name", "?") for h in data.get("recovered_by") or []), flush=True)
    if refused is None:
        return fail("the story had no compaction request")
    print("agent: the story went as it should: refused, spill read, retry allowed (session %s)" % args.session, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
