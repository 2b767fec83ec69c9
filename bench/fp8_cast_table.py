"""Join bench/mfu.py JSON files of one device job (bench/ops_session.sh fp8: one variant each) into one JSON and
print the table: tokens/s, MFU against the bf16 peak and (--fp8 rows) against the FP8 peak, each row against the
first (bf16), SM clock, the loss.

    python bench/fp8_cast_table.py --out bench/results/mfu_8b4l_fp8_cast_h200.json OUT/fp8_bf16.json OUT/fp8_fp8-*.json
"""

import argparse
import json
from pathlib import Path

__all__ = ["main", "join"]


def join(paths: list[Path]) -> dict:
    """{"meta": the first file's meta, "results": every file's results in the order given}."""
    docs = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
    return {"meta": docs[0].get("meta", {}) if docs else {}, "results": [r for d in docs for r in d.get("results", [])]}


def _fp8_peak(r: dict) -> str:
    """MFU against the FP8 dense peak (bench/mfu.py `mfu_fp8_peak`, --fp8 rows), '-' for the others."""
    return f"{r['mfu_fp8_peak']:.3f}" if r.get("mfu_fp8_peak") is not None else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    found = [f for f in args.files if f.is_file()]
    doc = join(found)
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    rows = doc["results"]
    base = (rows[0].get("tokens_per_s") or 0) if rows else 0
    print(f"{'variant':<26} {'s/step':>7} {'tokens/s':>9} {'MFU bf16pk':>10} {'MFU fp8pk':>9} {'x bf16':>7} {'SM MHz':>7} {'final loss':>11}  device")
    for r in rows:
        t = r.get("tokens_per_s") or 0
        mhz = r.get("sm_mhz")
        mhz = max(mhz) if isinstance(mhz, list) and mhz else mhz
        print(f"{r['name']:<26} {r.get('median_step_s') or 0:>7.3f} {t:>9.0f} {r.get('mfu') or 0:>10.3f} "
              f"{_fp8_peak(r):>9} {t / base if base else 0:>7.3f} {mhz or 0:>7} {r.get('final_loss') or 0:>11.6f}  {r.get('device', '?')}"
              + (f"  ERROR {r['error'].splitlines()[-1][:80]}" if "error" in r else ""))
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print("not run (no JSON):", ", ".join(missing))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
