"""The Lightning modules and their model: configuration, setup, FSDP2, LoRA, LM head,
loss, schedules."""
