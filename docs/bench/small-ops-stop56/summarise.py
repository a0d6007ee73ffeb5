import json,sys
for name in sys.argv[1:]:
    for line in open(name):
        d=json.loads(line); s=d['servers']
        rt = f"rt-floor {s['round_trip_p50_us']:6.1f} p50/rt {s['p50_vs_round_trip']:.2f}" if 'round_trip_p50_us' in s else ""
        print(f"  {d['mode']:5} {d['encoding']:10} {d['payload'][:14]:14} ops/s {d['rpcs_per_sec']:9.0f} p50 {d['p50_us']:7} {rt}")
