#!/usr/bin/env bash
# CISPO with rollout correction, in the style of verl's examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh
# (clip_ratio_low=10: no lower bound) and examples/rollout_correction/run_with_rollout_corr_multi_rs.sh (values
# quoted with escaped quotes, so that Hydra reads a comma as part of a string).
set -xeuo pipefail

rollout_rs="token_k1,seq_max_k2"
rollout_rs_threshold="0.6_1.6,2.5"
MODEL_PATH=${MODEL_PATH:-"Qwen/Qwen2.5-0.5B-Instruct"}

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=rloo_vectorized \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.policy_loss.loss_mode=cispo \
    actor_rollout_ref.actor.clip_ratio_low=10 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    algorithm.rollout_correction.rollout_rs=\'${rollout_rs}\' \
    algorithm.rollout_correction.rollout_rs_threshold=\'${rollout_rs_threshold}\' \
    trainer.logger='["console"]' \
    trainer.project_name=verl_cispo_example_gsm8k \
    trainer.experiment_name=qwen2.5_0.5b_cispo \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.val_before_train=False \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.total_epochs=15
