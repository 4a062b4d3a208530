#!/bin/bash
# SAPO on FSDP with its settings in multi-line quoted groups, in the style of verl's
# examples/sapo_trainer/run_qwen30b_sapo.sh: DATA_ROOT=${DATA_ROOT:-$PWD}, a backend chosen by a test, groups
# split where they are used unquoted, the critic's group made from the actor's by ${GROUP//from/to}.
set -x

DATA_ROOT=${DATA_ROOT:-$PWD}

backend=fsdp # fsdp, fsdp2, megatron
project_name=RL4LLM
experiment_name=qwen3-4b-sapo-$backend
default_local_dir=$DATA_ROOT/checkpoint/$project_name/$experiment_name

adv_estimator=grpo
loss_mode=sapo
use_kl_in_reward=False
use_kl_loss=False
kl_loss_coef=0.001
tau_pos=1.0
tau_neg=1.05

train_files=$DATA_ROOT/dataset/dapo/train.parquet
test_files=$DATA_ROOT/dataset/test/aime_24/train.parquet
actor_model_path=Qwen/Qwen3-4B-Base

max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
enable_overlong_buffer=True
overlong_buffer_len=$((1024 * 4))
overlong_penalty_factor=1.0
actor_max_token_len_per_gpu=$(((max_prompt_length + max_response_length) * 3))

param_offload=False
optimizer_offload=False

ACTOR_FSDP_CONFIG="
    actor_rollout_ref.actor.fsdp_config.param_offload=$param_offload \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=$optimizer_offload"

ACTOR_CONFIG="
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.path=$actor_model_path \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.use_kl_loss=$use_kl_loss \
    actor_rollout_ref.actor.kl_loss_coef=$kl_loss_coef \
    actor_rollout_ref.actor.tau_pos=$tau_pos \
    actor_rollout_ref.actor.tau_neg=$tau_neg \
    actor_rollout_ref.actor.policy_loss.loss_mode=${loss_mode}
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$actor_max_token_len_per_gpu"

CRITIC_FSDP_CONFIG="${ACTOR_FSDP_CONFIG//actor_rollout_ref.actor/critic.model}"
if [[ $backend == "megatron" ]]; then
    CONFIG_NAME=ppo_megatron_trainer
else # fsdp, fsdp2
    CONFIG_NAME=ppo_trainer
    ACTOR_CONFIG="$ACTOR_CONFIG $ACTOR_FSDP_CONFIG"
fi
if [[ $adv_estimator == "gae" ]]; then
    CRITIC_CONFIG="critic.model.path=$actor_model_path $CRITIC_FSDP_CONFIG"
else
    CRITIC_CONFIG=""
fi

ROLLOUT_CONFIG="
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.8 \
    actor_rollout_ref.rollout.n=16"

REWARD_CONFIG="
    reward_model.reward_manager=dapo \
    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=${enable_overlong_buffer} \
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=${overlong_buffer_len} \
    +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=${overlong_penalty_factor} \
    +reward_model.reward_kwargs.overlong_buffer_cfg.log=False \
    +reward_model.reward_kwargs.max_resp_len=${max_response_length}"

python -m verl.trainer.main_ppo \
    --config-path=./config \
    --config-name=$CONFIG_NAME \
    algorithm.adv_estimator=$adv_estimator \
    algorithm.use_kl_in_reward=$use_kl_in_reward \
    data.train_files="$train_files" \
    data.val_files="$test_files" \
    data.train_batch_size=256 \
    data.max_prompt_length=$max_prompt_length \
    data.max_response_length=$max_response_length \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    trainer.use_legacy_worker_impl=disable \
    trainer.logger=['console','wandb'] \
    trainer.project_name=$project_name \
    trainer.experiment_name=$experiment_name \
    trainer.default_local_dir=$default_local_dir \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=2 \
    trainer.val_before_train=False \
    trainer.save_freq=-1 \
    trainer.test_freq=10 \
    trainer.total_epochs=10 \
    $ACTOR_CONFIG \
    $CRITIC_CONFIG \
    $ROLLOUT_CONFIG \
    $REWARD_CONFIG
