"""One JSON line of GB/s from an iperf3 -J report: iperf_row.py CONNECTIONS MODE REPORT."""
import json
import sys

r = json.load(open(sys.argv[3]))["end"]
row = {"connections": int(sys.argv[1]), "mode": sys.argv[2]}
for key in ("sum_sent", "sum_received", "sum_sent_bidir_reverse", "sum_received_bidir_reverse"):
    if key in r:
        row[key + "_gb_per_s"] = round(r[key]["bits_per_second"] / 8e9, 3)
print(json.dumps(row))
