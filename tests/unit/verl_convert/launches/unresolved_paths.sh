#!/usr/bin/env bash
# GSPO whose paths come from variables the launch environment is meant to set, in the style of verl's
# examples/gspo_trainer/test_gspo_qwen30b_a3b_ep.sh: HDFS_ROOT=${HDFS_ROOT:-$PWD}, $DATA_ROOT set nowhere.
# Converted without them, it is refused, naming each line; nothing lands in a manifest.
set -xeuo pipefail

HDFS_ROOT=${HDFS_ROOT:-$PWD}
MODEL_PATH=$HDFS_ROOT/model/Qwen3-30B-A3B-Base
TRAIN_FILE=$DATA_ROOT/dataset/BytedTsinghua-SIA/DAPO-Math-17k/data/dapo-math-17k.parquet
aime24_test_path=$DATA_ROOT/dataset/aime-2024.parquet
TEST_FILE="['$aime24_test_path']"

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="${TRAIN_FILE}" \
    data.val_files="${TEST_FILE}" \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.actor.policy_loss.loss_mode=gspo
