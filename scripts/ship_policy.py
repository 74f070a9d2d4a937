"""Write a shipped policy and its warm-start drafter (gleanrl/shipped/) from a bootstrap output.

    python scripts/ship_policy.py POLICY_DIR [--size small|deep]
    # POLICY_DIR: `gleanrl bootstrap --task TASK --size SIZE --seed 0`'s output (gleanrl.shipped.SHIPPED[SIZE])

The policy is stored in the entry's dtype, the drafter is the demo's default warm start on it, and
SHA256SUMS lists every shipped weights file. Run from the repository root; commit what it writes."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch


def main() -> int:
    from gleanrl import demo, demo_setup
    from gleanrl.harvest.checkpoint import load_drafter, save_drafter
    from gleanrl.shipped import ROOT, SHIPPED, sha256, sums_file
    from gleanrl.trainer.bootstrap import cache_key

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policy")
    ap.add_argument("--size", default="small", choices=sorted(SHIPPED))
    opts = ap.parse_args()
    src, entry = Path(opts.policy), SHIPPED[opts.size]
    key = json.loads((src / "bootstrap.json").read_text())["key"]
    if key != (want := cache_key(entry.task, 0, entry.size)[1]):
        recipe = f"the {entry.size} recipe's on {entry.task} (seed 0)"
        print(f"{src}: bootstrap key {key} is not {recipe}: {want}", file=sys.stderr)
        return 2
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.rmtree(entry.policy, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, entry.dtype))
    model.save_pretrained(entry.policy, safe_serialization=True)
    AutoTokenizer.from_pretrained(src).save_pretrained(entry.policy)
    shutil.copy(src / "bootstrap.json", entry.policy / "bootstrap.json")
    # the demo's default warm start on the shipped policy
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--size", entry.size])
    demo_setup.apply_regime(args)
    shutil.rmtree(entry.drafter, ignore_errors=True)
    warm = demo_setup.warm_drafter(entry.policy, args)
    drafter = load_drafter(warm, target_config=entry.policy).to(torch.bfloat16)
    save_drafter(drafter, entry.drafter)
    (entry.drafter / "warm_start.json").write_text(json.dumps(demo_setup.warm_settings(args), indent=1))
    shipped = [d for e in SHIPPED.values() for d in (e.policy, e.drafter) if (d / "model.safetensors").is_file()]
    sums_file().write_text("".join(f"{sha256(d / 'model.safetensors')}  {d.name}/model.safetensors\n" for d in shipped))
    print(subprocess.run(["du", "-sh", str(ROOT)], capture_output=True, text=True).stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
