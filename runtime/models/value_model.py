"""How a critic's model loads: transformers' token-classification head, one value per token, no dropout.

`AutoModelForTokenClassification` puts a dropout before its value head, at the config's `classifier_dropout`,
else its `hidden_dropout`, else 0.1: for Qwen2 or Llama configs, which have neither, 0.1. The critic's update
runs in train mode while its values for GAE are computed in eval mode, so with that dropout it regressed values
it never predicted. verl's critic sets the same override. (On a GPU the dropout also draws from CUDA's generator:
the likely cause of the 0.04 by which #38's first GPU run found a critic update apart from the host's.)
"""

#: A critic's config overrides: `config.update(VALUE_MODEL)`, then `from_pretrained(path, config=config)`
#: (given as keywords, from_pretrained hands the ones a config lacks, like classifier_dropout, to the model).
VALUE_MODEL: dict[str, object] = {"num_labels": 1, "classifier_dropout": 0.0}
