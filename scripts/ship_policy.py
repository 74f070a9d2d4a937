"""Write the shipped demo policy and warm-start drafter (gleanrl/shipped/) from a bootstrap output.

    python scripts/ship_policy.py POLICY_DIR     # e.g. the output of `gleanrl bootstrap --size small`

The policy is stored in float32 (as the trainer's checkpoints are) with its bootstrap.json (which
must carry today's recipe key for size
small, seed 0), the drafter is the demo's default warm start on it, and SHA256SUMS lists both
weights files. Run from the repository root; commit what it writes."""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch


def main() -> int:
    from gleanrl import demo
    from gleanrl.harvest.checkpoint import load_drafter, save_drafter
    from gleanrl.shipped import DRAFTER, POLICY, ROOT, SUMS, sha256
    from gleanrl.trainer.bootstrap import cache_key

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("policy")
    src = Path(ap.parse_args().policy)
    key = json.loads((src / "bootstrap.json").read_text())["key"]
    if key != cache_key(None, 0, "small")[1]:
        print(f"{src}: bootstrap key {key} is not the small recipe's (seed 0)", file=sys.stderr)
        return 2
    from transformers import AutoModelForCausalLM, AutoTokenizer
    shutil.rmtree(POLICY, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)  # pushes must match
    model.save_pretrained(POLICY, safe_serialization=True)
    AutoTokenizer.from_pretrained(src).save_pretrained(POLICY)
    shutil.copy(src / "bootstrap.json", POLICY / "bootstrap.json")
    # the demo's default warm start on the shipped (bf16) policy
    args = argparse.ArgumentParser()
    demo.add_arguments(args)
    args = args.parse_args([])
    demo.apply_regime(args)
    warm = demo.warm_drafter(POLICY, args)
    shutil.rmtree(DRAFTER, ignore_errors=True)
    drafter = load_drafter(warm, target_config=POLICY).to(torch.bfloat16)
    save_drafter(drafter, DRAFTER)
    (DRAFTER / "warm_start.json").write_text(json.dumps(demo.warm_settings(args), indent=1))
    SUMS.write_text("".join(f"{sha256(d / 'model.safetensors')}  {d.name}/model.safetensors\n"
                            for d in (POLICY, DRAFTER)))
    print(subprocess.run(["du", "-sh", str(ROOT)], capture_output=True, text=True).stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
