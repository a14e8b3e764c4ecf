"""Terra's world model on vLLM: the model class (:mod:`terra.vllm.llama_action`), the plugin that registers it in
every vLLM process (:mod:`terra.vllm.plugin`), and the shims over vLLM versions (:mod:`terra.vllm.compat`)."""

FUTURE_SLOTS = "terra_future_slots"  # SamplingParams.extra_args: the slot values between a request's frames
