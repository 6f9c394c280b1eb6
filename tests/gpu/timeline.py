#!/usr/bin/env python3
"""Read a bench_gpu_transfer log run with BENCH_TIMELINE=1 DUET_LOG_LEVEL=trace
(tests/gpu/suite.sh transfer --timeline) and print each request's timeline in microseconds from
its t0: when each prefill rank's transfer thread took its last layers, when
it flushed and notified each decode rank, when each notification arrived,
and the bench's own marks (launched, landed, synced, ended, received)."""
import re
import sys

# the bench's two processes number requests alike; a plan's block starts
# with its "# prefill ranks on" line, so requests are keyed by (block, id)
block = 0
t0, marks, ev = {}, {}, {}
recv_marks = {}
order = []
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("# prefill ranks on") or line.startswith("# decode  ranks on"):
        if line.startswith("# prefill"):
            block += 1
        continue
    m = re.search(r"timeline prefill: request (\d+) t0 (\d+) launched (\d+) landed (\d+) synced (\d+) ended (\d+)", line)
    if m:
        k = (block, int(m.group(1)))
        t0[k] = int(m.group(2))
        marks[k] = dict(zip(("launched", "landed", "synced", "ended"), map(int, m.groups()[2:])))
        order.append(k)
        continue
    m = re.search(r"xfer p(\d+): request (\d+): layers \[(\d+), (\d+)\) released, taken at (\d+)", line)
    if m:
        k = (block, int(m.group(2)))
        ev.setdefault(k, []).append((int(m.group(5)), "p%s took layers [%s,%s)" % m.group(1, 3, 4)))
        continue
    m = re.search(r"xfer p(\d+): request (\d+) to decode rank (\d+): (\d+) puts posted, flush at (\d+)", line)
    if m:
        k = (block, int(m.group(2)))
        ev.setdefault(k, []).append((int(m.group(5)), "p%s flush to d%s (%s puts)" % m.group(1, 3, 4)))
        continue
    m = re.search(r"xfer p(\d+): request (\d+) to decode rank (\d+): flushed, notify at (\d+)", line)
    if m:
        k = (block, int(m.group(2)))
        ev.setdefault(k, []).append((int(m.group(4)), "p%s notify d%s" % m.group(1, 3)))
        continue
    m = re.search(r"xfer d(\d+): request (\d+): notification from prefill rank (\d+) at (\d+)", line)
    if m:
        k = (block, int(m.group(2)))
        ev.setdefault(k, []).append((int(m.group(4)), "d%s got p%s's notification" % m.group(1, 3)))
        continue
    m = re.search(r"timeline decode: received (\d+) imported (\d+)", line)
    if m:
        # the decode line of the request whose prefill line came last in this block
        ks = [k for k in order if k[0] == block]
        if ks:
            recv_marks.setdefault(block, []).append(tuple(map(int, m.groups())))

for k in order:
    base = t0[k]
    rows = [(v, name) for name, v in marks[k].items() if v > 0]
    rows += ev.get(k, [])
    for (r, i) in [(0, 0)]:
        pass
    rows.sort()
    last_taken = {}
    print("== plan block %d, request %d" % k)
    for v, name in rows:
        if "took layers" in name:
            last_taken[name.split()[0]] = (v, name)
            continue
        print("  %8.1f  %s" % ((v - base), name))
    for p, (v, name) in sorted(last_taken.items()):
        print("  %8.1f  (last) %s" % ((v - base), name))
    # decode marks: the n-th timeline decode line of the block for the n-th request
    ks = [x for x in order if x[0] == k[0]]
    i = ks.index(k)
    rm = recv_marks.get(k[0], [])
    if i < len(rm):
        print("  %8.1f  decode received all; %8.1f imported" % (rm[i][0] - base, rm[i][1] - base))
