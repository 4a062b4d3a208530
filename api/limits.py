"""Upper bounds for the counts and durations of a spec.

Every number a user writes has a maximum in the schema (the CRD refuses more at the API server, the
webhook and `kuberl validate` at the door). The bounds are far above any real job and low enough that
nothing done with a valid value can overflow: a deadline added to a timestamp stays a valid date for
thousands of years, and a seed fits the 32 bits numpy and vLLM take.
"""

#: Training steps, warm-up steps, intervals counted in steps.
MAX_STEPS = 10_000_000
#: Durations in seconds (deadlines, TTLs, timeouts): ten years.
MAX_DURATION_SECONDS = 10 * 366 * 86400
#: Samples or prompts in one batch.
MAX_BATCH = 65536
#: The largest seed: numpy's legacy seeding and vLLM take unsigned 32-bit seeds.
MAX_SEED = 2**32 - 1
#: Consecutive bad steps (non-finite updates) or a window of steps.
MAX_STREAK = 1000
#: Loss coefficients and clip ranges.
MAX_COEFFICIENT = 1000.0
#: Tokens in one micro-batch of one rank (a token-budget micro-batch): 16M, far above any device's memory.
MAX_TOKENS_PER_MICRO_BATCH = 1 << 24
