"""kuberl.operator — the kopf operator that turns RLJobs into KubeRay RayJobs (`kuberl operator`).

One level-triggered pass per RLJob: observe (RLJob + its RayJobs + its spec ConfigMap) -> decide
(pure) -> apply (server-side apply under the field manager `kuberl-operator`).

    names.py     deterministic names, labels, paths        builders.py  ConfigMap / RayJob / Event (pure)
    pods.py      pod resources, podTemplate merge (pure)   status.py    KubeRay state, conditions (pure)
    decide.py    the state machine (pure; spec changes: api/specdiff.py)
    access.py    per-job identity, Ray token, NetworkPolicy pruned.py    fields the API server dropped (pure)
    kube.py      REST verbs over the kubernetes client     reconcile.py one pass (I/O) and the per-job queue
    handlers.py  thin kopf handlers                        webhook.py   validating admission webhook
    metrics.py   Prometheus metrics                        settings.py  flags and environment
    main.py      `run_operator(args)`, `build_operator`, `serve`
"""
