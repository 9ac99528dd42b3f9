import json, glob, statistics, collections
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob("docs/results/read-charge/network-*-*.json")):
    v = f.split("/")[-1].split("-")[1]
    d = json.load(open(f))
    rep = d.get("report", d)
    for r in rep["rows"]:
        rows[(r["section"], r["name"])][v].append(r["samples_per_s"])
for k, d in rows.items():
    b, n = d.get("base", []), d.get("new", [])
    if "streambuf" in k[1]:
        print(f"{k[0]:10s} {k[1]:45s} base {[round(x) for x in b]} new {[round(x) for x in n]} ratio {statistics.median(n)/statistics.median(b) if b and n else float('nan'):.2f}")
    else:
        print(f"{k[0]:10s} {k[1]:45s} base {[round(x) for x in b]} new {[round(x) for x in n]}")
