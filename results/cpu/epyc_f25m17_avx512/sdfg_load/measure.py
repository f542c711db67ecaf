"""from_file against pickle.loads for every program.sdfg of one build cache (best of 3 each)."""
import csv, glob, os, pickle, sys, time, warnings
warnings.simplefilter("ignore")
import dace
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*", "program.sdfg"))):
    t_json = t_pickle = 1e9
    for _ in range(3):
        t = time.perf_counter(); s = dace.SDFG.from_file(f); t_json = min(t_json, time.perf_counter() - t)
    data = pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL)
    for _ in range(3):
        t = time.perf_counter(); pickle.loads(data); t_pickle = min(t_pickle, time.perf_counter() - t)
    rows.append({"build": os.path.basename(os.path.dirname(f)), "sdfg_bytes": os.path.getsize(f),
                 "json_s": round(t_json, 4), "pickle_s": round(t_pickle, 4)})
w = csv.DictWriter(sys.stdout, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
