"""Terra's world model on vLLM: the model class, the plugin that registers it, and the shims over vLLM versions."""

FUTURE_SLOTS = "terra_future_slots"  # SamplingParams.extra_args: the slot values between a request's frames
