#!/usr/bin/env python3
"""Copies deploy/nats/accounts.conf and permissions.conf into
deploy/helm/nats-values.yaml (configMap.merge.data, indented 8 spaces), which
deploy's TestHelmValues requires to hold them verbatim."""
import pathlib, re

root = pathlib.Path(__file__).resolve().parent.parent
values = root / "deploy/helm/nats-values.yaml"
text = values.read_text()
for name in ("permissions.conf", "accounts.conf"):
    body = (root / "deploy/nats" / name).read_text()
    block = "".join(("        " + l if l.strip() else "\n") if l.endswith("\n") else "        " + l
                    for l in body.splitlines(keepends=True))
    pat = re.compile(r"(      %s: \|\n)(.*?)(?=\n      \S|\n\S)" % re.escape(name), re.S)
    m = pat.search(text)
    if not m:
        raise SystemExit("no %s block in %s" % (name, values))
    text = text[:m.start(2)] + block.rstrip("\n") + text[m.end(2):]
values.write_text(text)
