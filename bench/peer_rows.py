#!/usr/bin/env python3
"""Writes the rows of `weir run` in the CSV shape of the Flink peer's sink, so
that the peer's own checker (../shared/peers/*/check.py) judges both.

Usage: peer_rows.py ROWS.jsonl OUT_DIR --shape payments|q7a|q5a

Keeps each window's highest revision (a key and window published more than
once counts once, as its last row) and refuses a final row that is not
settled: what is compared is what weir says is settled.
"""
import argparse
import json
import os
import sys


def flink_time(rfc3339):
    # "2024-01-01T00:01:00.000Z" -> "2024-01-01 00:01:00" (the peer's CSV, UTC)
    s = rfc3339.rstrip("Z").replace("T", " ")
    return s[:-4] if s.endswith(".000") else s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows")
    ap.add_argument("out_dir")
    ap.add_argument("--shape", required=True, choices=["payments", "q7a", "q5a"])
    a = ap.parse_args()
    last = {}
    with open(a.rows) as f:
        for n, line in enumerate(f, 1):
            row = json.loads(line)
            k = (json.dumps(row["key"], sort_keys=True), row["window_start"])
            if k not in last or row["revision"] >= last[k]["revision"]:
                last[k] = row
    unsettled = [r for r in last.values() if r["status"] != "settled"]
    if unsettled:
        print(f"{len(unsettled)} windows end on a row that is not settled, e.g. {unsettled[0]}", file=sys.stderr)
        sys.exit(1)
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "weir.csv"), "w") as out:
        for r in last.values():
            ws, we = flink_time(r["window_start"]), flink_time(r["window_end"])
            v = r["values"]
            if a.shape == "payments":
                out.write(f'{r["key"]["account_id"]},{ws},{we},{v["revenue"]},{v["payments"]}\n')
            elif a.shape == "q7a":
                out.write(f'{v["max_price"]},{ws},{we}\n')
            else:
                out.write(f'{r["key"]["bid.auction"]},{v["bids"]},{ws},{we}\n')
    print(f"{len(last)} windows written", file=sys.stderr)


if __name__ == "__main__":
    main()
