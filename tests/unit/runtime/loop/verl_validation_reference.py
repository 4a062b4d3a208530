"""verl's validation metrics, restated plainly from verl/trainer/ppo/metric_utils.py at commit b178a3cd (2026-01-29;
the file last changed in bb64f421a): bootstrap_metric, calc_maj_val and process_validation_metrics, in verl's own
shape (Python loops, the global numpy seed). The yardstick tests/unit/runtime/loop/test_validation_and_shaping.py holds
kuberl's runtime/loop/validation.py to. No kuberl code is used here.
"""

from collections import defaultdict
from functools import partial

import numpy as np


def bootstrap_metric(data, subset_size, reduce_fns, n_bootstrap=1000, seed=42):
    np.random.seed(seed)
    data_np = np.array(data, dtype=object)
    n_data = len(data_np)
    bootstrap_idxs = np.random.choice(n_data, size=(n_bootstrap, subset_size), replace=True)
    n_fns = len(reduce_fns)
    metric_results = np.empty((n_fns, n_bootstrap), dtype=np.float64)
    for fn_idx, reduce_fn in enumerate(reduce_fns):
        for boot_idx in range(n_bootstrap):
            sample = data_np[bootstrap_idxs[boot_idx]]
            metric_results[fn_idx, boot_idx] = reduce_fn(sample)
    return [(float(np.mean(metric_results[fn_idx])), float(np.std(metric_results[fn_idx]))) for fn_idx in range(n_fns)]


def calc_maj_val(data, vote_key, val_key):
    vote2vals = defaultdict(list)
    for d in data:
        vote2vals[d[vote_key]].append(d[val_key])
    vote2cnt = {k: len(v) for k, v in vote2vals.items()}
    maj_vote = max(vote2cnt, key=vote2cnt.get)
    return vote2vals[maj_vote][0]


def process_validation_metrics(data_sources, sample_uids, infos_dict, seed=42):
    data_src2uid2var2vals = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for sample_idx, data_source in enumerate(data_sources):
        uid = sample_uids[sample_idx]
        var2vals = data_src2uid2var2vals[data_source][uid]
        for var_name, var_vals in infos_dict.items():
            var2vals[var_name].append(var_vals[sample_idx])

    def gen_ns(n_resps):
        if n_resps <= 1:
            return []
        ns, n = [], 2
        while n < n_resps:
            ns.append(n)
            n *= 2
        ns.append(n_resps)
        return ns

    data_src2uid2var2metric = {}
    for data_source, uid2var2vals in data_src2uid2var2vals.items():
        uid_dict = data_src2uid2var2metric.setdefault(data_source, {})
        for uid, var2vals in uid2var2vals.items():
            pred_vals = var2vals.get("pred")
            has_pred = pred_vals is not None
            var_dict = uid_dict.setdefault(uid, {})
            for var_name, var_vals in var2vals.items():
                if not var_vals or isinstance(var_vals[0], str):
                    continue
                n_resps = len(var_vals)
                metric = {f"mean@{n_resps}": float(np.mean(var_vals))}
                if n_resps > 1:
                    metric[f"std@{n_resps}"] = float(np.std(var_vals))
                    for n in gen_ns(n_resps):
                        (bon_mean, bon_std), (won_mean, won_std) = bootstrap_metric(
                            data=var_vals, subset_size=n, reduce_fns=[np.max, np.min], n_bootstrap=1000, seed=seed
                        )
                        metric[f"best@{n}/mean"] = bon_mean
                        metric[f"best@{n}/std"] = bon_std
                        metric[f"worst@{n}/mean"] = won_mean
                        metric[f"worst@{n}/std"] = won_std
                        if has_pred:
                            vote_data = [
                                {"val": val, "pred": pred} for val, pred in zip(var_vals, pred_vals, strict=True)
                            ]
                            [(maj_n_mean, maj_n_std)] = bootstrap_metric(
                                data=vote_data,
                                subset_size=n,
                                reduce_fns=[partial(calc_maj_val, vote_key="pred", val_key="val")],
                                n_bootstrap=1000,
                                seed=seed,
                            )
                            metric[f"maj@{n}/mean"] = maj_n_mean
                            metric[f"maj@{n}/std"] = maj_n_std
                var_dict[var_name] = metric

    data_src2var2metric2uid_vals = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for data_source, uid2var2metric in data_src2uid2var2metric.items():
        for _uid, var2metric in uid2var2metric.items():
            for var_name, metric in var2metric.items():
                for metric_name, metric_val in metric.items():
                    data_src2var2metric2uid_vals[data_source][var_name][metric_name].append(metric_val)

    data_src2var2metric2val = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for data_source, var2metric2uid_vals in data_src2var2metric2uid_vals.items():
        for var_name, metric2uid_vals in var2metric2uid_vals.items():
            for metric_name, uid_vals in metric2uid_vals.items():
                data_src2var2metric2val[data_source][var_name][metric_name] = np.mean(uid_vals)
    return data_src2var2metric2val
