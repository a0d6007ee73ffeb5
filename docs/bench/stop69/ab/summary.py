"""Summaries of docs/bench/stop69/ab: apply passes, one worker's exchange, ps-local.
   python3 docs/bench/stop69/ab/summary.py DIR   (DIR holds apply-*.json, pl-*.json and w-*/steps.csv or w-*-steps.csv.gz)"""
import collections, csv, glob, gzip, io, json, os, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__)
apply = collections.defaultdict(list)
for f in sorted(glob.glob(f'{d}/apply-*.json')):
    b, sz = os.path.basename(f).split('-')[1:3]
    for line in open(f):
        r = json.loads(line)
        apply[(sz, r['pass'], b)].append(r['key_bytes_per_sec'] / 1e9)
for k in sorted(apply):
    print('apply', *k, 'GB/s', ' '.join(f'{x:.2f}' for x in apply[k]))

def steps(path):
    text = gzip.open(path, 'rt').read() if path.endswith('.gz') else open(path).read()
    return list(csv.DictReader(io.StringIO(text)))

for f in sorted(glob.glob(f'{d}/w-*/steps.csv') + glob.glob(f'{d}/w-*-steps.csv.gz')):
    r = steps(f)
    med = lambda k, s: sorted(float(x[k]) for x in s)[len(s) // 2] * 1e6
    late = r[2000:]
    print('worker', f.replace(d, '').strip('/'), 'exchange p50 from step 2000: %.1f us' % (2 * med('push_seconds', late) + med('wait_seconds', late)),
          'first 800 steps: %.1f us' % (2 * med('push_seconds', r[:800])), 'compute %.1f us' % med('compute_seconds', late))

pl = collections.defaultdict(list)
for f in sorted(glob.glob(f'{d}/pl-*.json')):
    _, b, p, e, r = os.path.basename(f)[:-5].split('-')
    pl[(e, b, p)].append(json.load(open(f))['examples_per_second'] / 1e3)
for e in sorted({k[0] for k in pl}):
    for b in ['base', 'new']:
        g, s = pl[(e, b, 'grpc')], pl[(e, b, 'shm')]
        print('ps-local', e, b, 'grpc k ex/s', ' '.join(f'{x:.0f}' for x in g), 'shm', ' '.join(f'{x:.0f}' for x in s),
              'shm/grpc', ' '.join(f'{y / x:.2f}' for x, y in zip(g, s)))
