"""Groups of Ray actors the driver starts and, for the elastic ones, scales.

launch.py        Ray joined or started, and every group of the topology (api/topology.py) started on its pool
elastic.py       ElasticPool: workers that come and go between minReplicas and maxReplicas
autoscale.py     the pure policy that sizes an elastic pool from its queue
rollout.py       the separate rollout pool: engine replicas fed prompt chunks and weight buckets
reward.py        the reward pool: scoring workers for a function, a model or an endpoint
environment.py   the environment workers of multi-turn episodes
"""
