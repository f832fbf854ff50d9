#!/usr/bin/env python3
"""Receives the verdicts `seamguard forward` delivers, with the standard
library alone.

    python3 examples/python/receiver.py --port 8081
    seamguard forward --to http://127.0.0.1:8081/ --kinds refused,halted

Each verdict arrives as a CloudEvent in binary mode over HTTP: its attributes
in ce-* headers (percent-encoded, as the CloudEvents HTTP binding asks), its
data, a JSON object, as the body. Structured mode (Content-Type
application/cloudevents+json) is read too. For each event the receiver prints
one line, flushed at once:

    refused ops-agent-42 request=compact-1 reasons=coverage_hole spill=ops-agent-42/1.jsonl next=retry id=sg-... seq=2 signer=N...

and answers 204. A request that is no CloudEvent gets 400, which forward
treats as permanent: the verdict is kept as undeliverable (seamguard forward
failed lists it). The verdict's signature comes along in the
Seamguard-Signer and Seamguard-Signature headers; checking it needs ed25519,
which the standard library lacks (docs/forward.md says how, with Go's
forward.VerifyRequest or any ed25519 library), so this example prints the
signer and does not check it.

--port 0 picks a free port; the first line printed names the address.
"""
import argparse
import json
import signal
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KINDS = {
    "io.seamguard.compaction.allowed": "allowed",
    "io.seamguard.compaction.refused": "refused",
    "io.seamguard.transcript.spilled": "spilled",
    "io.seamguard.session.halted": "halted",
    "io.seamguard.event.rejected": "rejected",
    "io.seamguard.compaction.violation": "violation",
}


def ce_attributes(headers):
    """The ce-* headers, names lower-cased without the prefix, values
    percent-decoded."""
    attrs = {}
    for name, value in headers.items():
        if name.lower().startswith("ce-"):
            attrs[name[3:].lower()] = urllib.parse.unquote(value)
    return attrs


def describe(attrs, data):
    kind = KINDS.get(attrs.get("type", ""), attrs.get("type", "?"))
    parts = [kind, attrs.get("subject") or "_invalid"]
    if "request_id" in data:
        parts.append("request=" + str(data["request_id"]))
    if kind == "refused":
        parts.append("reasons=" + ",".join(r.get("code", "?") for r in data.get("reasons") or []))
        if data.get("spill"):
            parts.append("spill=" + data["spill"].get("name", "?"))
        parts.append("next=" + str(data.get("next")))
    elif kind == "allowed":
        cured = data.get("cured") or []
        if cured:
            parts.append("cured=" + ",".join(cured))
    elif kind == "spilled":
        parts.append("spill=" + str(data.get("name")))
    elif kind == "halted":
        parts.append("unrecoverable=" + ",".join("[%s,%s)" % (r.get("start"), r.get("end")) for r in data.get("unrecoverable") or []))
    elif kind == "rejected":
        parts.append("code=%s field=%s" % (data.get("code"), data.get("field")))
    parts.append("id=" + attrs.get("id", "?"))
    return " ".join(parts)


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        try:
            if ctype == "application/cloudevents+json":
                event = json.loads(body)
                attrs = {k: str(v) for k, v in event.items() if k != "data"}
                data = event.get("data") or {}
            else:
                attrs = ce_attributes(self.headers)
                if attrs.get("specversion") != "1.0":
                    raise ValueError("no ce-specversion 1.0 header: not a binary-mode CloudEvent")
                data = json.loads(body) if body else {}
            if not isinstance(data, dict):
                raise ValueError("the data is not a JSON object")
        except ValueError as e:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(("not a CloudEvent: %s\n" % e).encode())
            return
        line = describe(attrs, data)
        seq = self.headers.get("Seamguard-Verdict-Seq")
        if seq:
            line += " seq=" + seq
        signer = self.headers.get("Seamguard-Signer")
        line += " signer=" + (signer if signer else "none")
        print(line, flush=True)
        self.send_response(204)
        self.end_headers()

    def log_message(self, format, *args):
        pass  # one line per event, above, and nothing else


def main():
    ap = argparse.ArgumentParser(description="print the verdicts seamguard forward delivers")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8081, help="0 picks a free port")
    args = ap.parse_args()
    srv = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    host, port = srv.server_address[:2]
    print("listening on http://%s:%d/" % (host, port), flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
