import json, re, sys, collections
def load(p):
    d = json.load(open(p)); ev = d['traceEvents'] if isinstance(d, dict) else d
    names = {(e['pid'], e['tid']): e['args']['name'] for e in ev if e['ph'] == 'M' and e['name'] == 'thread_name'}
    return [e for e in ev if e['ph'] == 'X'], names
for p in sys.argv[1:]:
    X, names = load(p)
    print(p)
    # micro-batch index -> step: m=4 per replica; steady micro-batches 8..23 (steps 2..5)
    for pid in sorted({e['pid'] for e in X}):
        tot = collections.defaultdict(float); cnt = collections.Counter()
        for e in X:
            if e['pid'] != pid: continue
            m = re.match(r'([A-Z]+)\.?(\d+)', e['name'])
            if not m: continue
            kind, i = m.group(1), int(m.group(2))
            steady = (8 <= i < 24) if kind not in ('OPT', 'AR', 'SP') else (2 <= i < 6)
            if steady:
                tot[kind] += e['dur'] / 1e6 / 4; cnt[kind] += 1
        print(' rank', pid, {k: round(v, 3) for k, v in sorted(tot.items())})
