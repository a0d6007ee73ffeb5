import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith('{')]
print("| key | op | path | p50 µs | ops/s | GB/s | /TCP | /floor | server cores | worker cores |")
for r in rows:
    s=r.get('servers') or {}
    sc=sum(x['cores'] for x in s.get('servers',[]))
    wc=sum(x['cores'] for x in s.get('workers',[]))
    print("| %s | %s | %s | %.0f | %.0f | %.2f | %.2f | %s | %.2f | %.2f |"%(r['payload'], r['mode'], r['encoding'].split()[-1], r['p50_us'], r['rpcs_per_sec'], r['throughput_bytes_per_sec']/1e9, r['ratio_vs_tcp'], ('%.2f'%s['ratio_vs_floor']) if 'ratio_vs_floor' in s else '-', sc, wc))
