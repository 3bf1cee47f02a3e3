import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = [r for r in rows[2:] if len(r) == len(hdr)]
I = {h: i for i, h in enumerate(hdr)}
tot = sum(int(r[I["Warp Stall Sampling (All Samples)"]] or 0) for r in data)
print(rows[0][0][:200]); print("total samples", tot, "instructions", len(data))
reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
agg = {h: sum(int(r[I[h]] or 0) for r in data) for h in reasons}
print("by reason:", {k: round(100*v/tot,1) for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:8]})
top = sorted(range(len(data)), key=lambda k: -int(data[k][I["Warp Stall Sampling (All Samples)"]] or 0))[:int(sys.argv[2]) if len(sys.argv)>2 else 25]
for k in sorted(top):
    r = data[k]
    s = int(r[I["Warp Stall Sampling (All Samples)"]]); rs = sorted(((int(r[I[h]] or 0), h[6:]) for h in reasons), reverse=True)[:2]
    print(f"{k:4d} {100*s/tot:5.1f}% {r[I['Source']].strip()[:60]:60s} {rs}")
