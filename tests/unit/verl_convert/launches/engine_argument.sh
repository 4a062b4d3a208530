#!/usr/bin/env bash
# GRPO whose engine and tensor parallelism come from the script's arguments, in the style of verl's
# examples/grpo_trainer/run_qwen2_5_vl-7b.sh (ENGINE=${1:-vllm}) and run_qwen2-7b_math_trtllm.sh (TP=${1:-4},
# a test on it, an optional suffix, "${@:2}"): converted with no arguments, every default applies.
set -x

ENGINE=${1:-vllm}
TP=${TP:-2}
EXP_NAME=qwen2-7b-grpo-tp${TP}${EXP_NAME_SUFFIX:+"-"}${EXP_NAME_SUFFIX:-}

if [ $TP -eq 4 ]; then
    MAX_NUM_SEQS=1024
else
    MAX_NUM_SEQS=384
fi

DATADIR=${DATADIR:-$HOME/data}
TRAIN_FILES="['$DATADIR/gsm8k/train.parquet', '$DATADIR/math/train.parquet']"
TEST_FILES="['$DATADIR/gsm8k/test.parquet', '$DATADIR/math/test.parquet']"

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$TRAIN_FILES" \
    data.val_files="$TEST_FILES" \
    data.train_batch_size=512 \
    data.max_prompt_length=1024 \
    data.max_response_length=2048 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.rollout.name=$ENGINE \
    actor_rollout_ref.rollout.tensor_model_parallel_size=$TP \
    actor_rollout_ref.rollout.max_num_seqs=$MAX_NUM_SEQS \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    algorithm.use_kl_in_reward=False \
    trainer.logger='["console","wandb"]' \
    trainer.project_name='verl_grpo_example_gsm8k_math' \
    trainer.experiment_name="$EXP_NAME" \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.val_before_train=False \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 \
    "${@:2}"
