"""osftrt inside the trainers people already use, one module per system;
each imports its system only when imported itself:

* :mod:`.axolotl` -- ``OsftrtPlugin``, an axolotl plugin (``plugins:`` line,
  also registered through axolotl's ``axolotl.plugins`` entry point): fused
  cross-entropy, tiled MLP, OSFT, long context, FSDP2, dense checkpoints.
* :mod:`.mini_trainer` -- mini_trainer's (``rhai-innovation-mini-trainer``,
  training-hub's OSFT backend) OSFT model on osftrt in one call, its
  checkpoints' keys mapped both ways, the decomposition split over ranks.
* :mod:`.soap` -- NVIDIA Emerging-Optimizers' SOAP with every eigenbasis
  refresh of a step in one batched QR call.
* :mod:`.trl` -- TRL's ``SFTTrainer`` on a patched model.
"""
