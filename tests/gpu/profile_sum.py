"""Sum an Nsight Compute CSV log (ncu --csv --metrics gpu__time_duration.sum)
by kernel name: share, total, calls and average per kernel, largest first.

    python3 tests/gpu/profile_sum.py LOG.csv
"""
import collections
import csv
import sys


def main(path):
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit("%s: no kernels profiled" % path)
    tot, calls = collections.Counter(), collections.Counter()
    for r in csv.DictReader(lines[start:]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0][:90]
        tot[name] += float(r["Metric Value"].replace(",", ""))
        calls[name] += 1
    s = sum(tot.values()) or 1.0
    print("%d kernels, %.3f ms of GPU time (all profiled ranges together)"
          % (sum(calls.values()), s / 1e6))
    print("%6s %9s %7s %9s  %s" % ("share", "ms", "calls", "avg us", "kernel"))
    for n, t in tot.most_common(25):
        print("%5.1f%% %9.3f %7d %9.2f  %s"
              % (100 * t / s, t / 1e6, calls[n], t / calls[n] / 1e3, n))


if __name__ == "__main__":
    main(sys.argv[1])
