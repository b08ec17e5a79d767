#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include "config/host_ram.hpp"
#include "config/train_config.hpp"
#include "kernels/param_layout.hpp"
#include "temp_dir.hpp"

using namespace mt;

namespace {

// A config whose keys are all valid and whose files exist (in `dir`).
TrainConfig valid_config(const test::TempDir& dir) {
  TrainConfig c;
  dir.file("demo_train_000.bin", "x");
  c.data.train_files = dir.path() + "/*train*.bin";
  c.train.output_dir = dir.path() + "/out";
  c.threads.total = 2;
  return c;
}

std::string error_of(const TrainConfig& c) {
  try {
    c.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the defaults with existing data files validate", "[config]") {
  test::TempDir dir;
  CHECK(error_of(valid_config(dir)).empty());
}

TEST_CASE("each bad value is reported with its key", "[config]") {
  test::TempDir dir;
  struct Case {
    const char* expected;  // the message starts with the key, then says what is wrong
    std::function<void(TrainConfig&)> spoil;
  };
  const Case cases[] = {
      {"train.output_dir: must not be empty", [](TrainConfig& c) { c.train.output_dir = ""; }},
      {"train.per_device_train_batch_size: must be >= 1, got 0",
       [](TrainConfig& c) { c.train.per_device_train_batch_size = 0; }},
      {"train.gradient_accumulation_steps: must be >= 1, got -2",
       [](TrainConfig& c) { c.train.gradient_accumulation_steps = -2; }},
      {"train.max_steps: must be >= 1", [](TrainConfig& c) { c.train.max_steps = 0; }},
      {"train.learning_rate: must be a finite number > 0, got -0.1",
       [](TrainConfig& c) { c.train.learning_rate = -0.1; }},
      {"train.learning_rate: must be a finite number > 0, got nan",
       [](TrainConfig& c) { c.train.learning_rate = std::nan(""); }},
      {"train.lr_scheduler_type: 'cosine_with_restarts' is not one of: constant, linear, cosine",
       [](TrainConfig& c) { c.train.lr_scheduler_type = "cosine_with_restarts"; }},
      {"train.warmup_steps: must be >= 0", [](TrainConfig& c) { c.train.warmup_steps = -1; }},
      {"data.packing: 'document' is not one of: auto, stream, documents",
       [](TrainConfig& c) { c.data.packing = "document"; }},
      {"cluster.collective_timeout_s: must be a finite number > 0, got 0",
       [](TrainConfig& c) { c.cluster.collective_timeout_s = 0; }},
      {"cluster.mode: 'always' is not one of: auto, on, off", [](TrainConfig& c) { c.cluster.mode = "always"; }},
      {"train.min_lr_ratio: must be in [0, 1]", [](TrainConfig& c) { c.train.min_lr_ratio = 1.5; }},
      {"train.weight_decay: must be a finite number >= 0", [](TrainConfig& c) { c.train.weight_decay = -1; }},
      {"train.adam_beta1: must be in [0, 1), got 1", [](TrainConfig& c) { c.train.adam_beta1 = 1.0; }},
      {"train.adam_beta2: must be in [0, 1)", [](TrainConfig& c) { c.train.adam_beta2 = -0.5; }},
      {"train.adam_epsilon: must be a finite number > 0", [](TrainConfig& c) { c.train.adam_epsilon = 0; }},
      {"train.max_grad_norm: must be a finite number >= 0", [](TrainConfig& c) { c.train.max_grad_norm = -1; }},
      {"train.seed: must be >= 0", [](TrainConfig& c) { c.train.seed = -5; }},
      {"train.optimizer_compression: 'zstd' is not one of: none, lossless, int8",
       [](TrainConfig& c) { c.train.optimizer_compression = "zstd"; }},
      {"train.offload_staging_stages: must be >= 3, got 2", [](TrainConfig& c) { c.train.offload_staging_stages = 2; }},
      {"train.offload_io_threads: must be >= 1, got 0", [](TrainConfig& c) { c.train.offload_io_threads = 0; }},
      {"train.offload_params: needs train.offload_dir", [](TrainConfig& c) { c.train.offload_params = true; }},
      {"train.offload_params: needs train.bf16 = true",
       [](TrainConfig& c) { c.train.offload_params = true, c.train.offload_dir = "/tmp/x"; }},
      {"train.master_weights: 'half' is not one of: auto, fp32, split",
       [](TrainConfig& c) { c.train.master_weights = "half"; }},
      {"train.master_weights: split needs train.bf16 = true", [](TrainConfig& c) { c.train.master_weights = "split"; }},
      {"train.master_weights: split needs the Adam moments fp32 in the host tiles",
       [](TrainConfig& c) {
         c.train.master_weights = "split", c.train.bf16 = true, c.train.optimizer_compression = "int8";
       }},
      {"train.master_weights: split keeps the masters in RAM; train.offload_params = true",
       [](TrainConfig& c) {
         c.train.master_weights = "split", c.train.bf16 = true, c.train.offload_params = true;
         c.train.offload_dir = "/tmp/x";
       }},
      {"train.gradient_buffer: 'none' is not one of: auto, model, stage",
       [](TrainConfig& c) { c.train.gradient_buffer = "none"; }},
      {"train.gradient_buffer: stage needs each stage's gradient complete after one backward: device.gpus = 2",
       [](TrainConfig& c) { c.train.gradient_buffer = "stage", c.device.gpus = 2; }},
      {"train.gradient_buffer: stage needs each stage's gradient complete after one backward: 2 ranks need "
       "cluster.shard_state = true",
       [](TrainConfig& c) { c.train.gradient_buffer = "stage", c.cluster.ranks = 2; }},
      {"train.tf32: needs device.backend = cuda", [](TrainConfig& c) { c.train.tf32 = true; }},
      {"train.tf32: applies to fp32 compute",
       [](TrainConfig& c) { c.train.tf32 = true, c.train.bf16 = true, c.device.backend = "cuda"; }},
      {"train.save_steps: must be >= 0", [](TrainConfig& c) { c.train.save_steps = -1; }},
      {"model.config_file: set either",
       [](TrainConfig& c) { c.model.config_file = "a", c.model.model_name_or_path = "b"; }},
      {"model.hidden_size: must be >= 1, got 0", [](TrainConfig& c) { c.model.hidden_size = 0; }},
      {"model.layers: must be >= 1", [](TrainConfig& c) { c.model.layers = 0; }},
      {"model.vocab_size: must be >= 1", [](TrainConfig& c) { c.model.vocab_size = -1; }},
      {"model.arch: unsupported model_type 'bert'", [](TrainConfig& c) { c.model.arch = "bert"; }},
      {"model.heads: 7 does not divide model.hidden_size=384", [](TrainConfig& c) { c.model.heads = 7; }},
      {"model: model config: num_attention_heads (6) is not a multiple of num_key_value_heads (4)",
       [](TrainConfig& c) { c.model.kv_heads = 4; }},
      {"model.rope_theta: must be a finite number > 0", [](TrainConfig& c) { c.model.rope_theta = 0; }},
      {"data.seq_length: 2048 exceeds model.max_position_embeddings=1024",
       [](TrainConfig& c) { c.data.seq_length = 2048; }},
      {"data.seq_length: must be >= 1", [](TrainConfig& c) { c.data.seq_length = 0; }},
      {"device.backend: 'tpu' is not one of: cpu, cuda", [](TrainConfig& c) { c.device.backend = "tpu"; }},
      {"device.max_vram_gb: must be a finite number > 0, got 0", [](TrainConfig& c) { c.device.max_vram_gb = 0; }},
      {"device.max_vram_gb: must be a finite number > 0, got -0.0625",
       [](TrainConfig& c) { c.device.max_vram_gb = -0.0625; }},
      {"device.weight_slots: must be >= 2, got 1", [](TrainConfig& c) { c.device.weight_slots = 1; }},
      {"device.grad_slots: must be >= 0", [](TrainConfig& c) { c.device.grad_slots = -1; }},
      {"device.keep_intermediates: 'some' is not one of: auto, boundary, boundary_host, boundary_mapped, all, "
       "all_mapped",
       [](TrainConfig& c) { c.device.keep_intermediates = "some"; }},
      {"device.attention_kv: 'disk' is not one of: auto, device, host",
       [](TrainConfig& c) { c.device.attention_kv = "disk"; }},
      {"device.copy_bandwidth_gbps: must be a finite number >= 0",
       [](TrainConfig& c) { c.device.copy_bandwidth_gbps = -1; }},
      {"device.prefetch_depth: must be <= 1, got 2",
       [](TrainConfig& c) {
         c.device.weight_slots = 2;
         c.device.prefetch_depth = 2;
       }},
      {"device.schedule: 'zigzag' is not one of: interleaved, sequential",
       [](TrainConfig& c) { c.device.schedule = "zigzag"; }},
      {"device.gpus: must be >= 1, got 0", [](TrainConfig& c) { c.device.gpus = 0; }},
      {"device.gpus: must be <= 64, got 65", [](TrainConfig& c) { c.device.gpus = 65; }},
      {"threads.total: must be >= 0", [](TrainConfig& c) { c.threads.total = -1; }},
      {"threads.copy: must be <= 2", [](TrainConfig& c) { c.threads.copy = 3; }},
      {"threads.blas: 3 exceeds threads.total=2", [](TrainConfig& c) { c.threads.blas = 3; }},
      {"threads.optimizer: 4 exceeds threads.total=2", [](TrainConfig& c) { c.threads.optimizer = 4; }},
      {"log.logging_steps: must be >= 1", [](TrainConfig& c) { c.log.logging_steps = 0; }},
  };
  for (const auto& k : cases) {
    TrainConfig c = valid_config(dir);
    k.spoil(c);
    INFO("expected: " << k.expected);
    CHECK_THAT(error_of(c), Catch::StartsWith(k.expected));
  }
}

// The GPU count itself is checked with the backend before anything starts (check_backend_available,
// tests/kernels/test_backend.cpp); validation knows only what the build has.
TEST_CASE("device.gpus > 1 with device.backend = cuda: refused without NCCL in the build", "[config]") {
  test::TempDir dir;
  TrainConfig c = valid_config(dir);
  c.device.backend = "cuda";
  c.device.gpus = 2;
#if MEGATRAIN_HAVE_NCCL
  CHECK(error_of(c).empty());
#else
  CHECK_THAT(error_of(c), Catch::StartsWith("device.gpus: 2 GPUs need the cross-device gradient reduction (NCCL)"));
#endif
  c.device.backend = "cpu";  // N arenas in one process: every build
  CHECK(error_of(c).empty());
}

// How a job's ranks move their gradients (device/grad_transport.hpp): the key's value alone, then what
// the backend and the build allow; its resolution for the engine.
TEST_CASE("cluster.gpu_transport: auto | nccl | mpi, nccl only on the cuda backend of a build with NCCL", "[config]") {
  test::TempDir dir;
  TrainConfig c = valid_config(dir);
  CHECK(c.cluster.gpu_transport == "auto");
  CHECK(c.rank_grad_transport() == "mpi");  // the cpu backend's device memory is host memory
  c.cluster.gpu_transport = "gloo";
  CHECK_THAT(error_of(c), Catch::StartsWith("cluster.gpu_transport: 'gloo' is not one of: auto, nccl, mpi"));
  c.cluster.gpu_transport = "nccl";
#if MEGATRAIN_HAVE_NCCL
  CHECK_THAT(error_of(c), Catch::StartsWith("cluster.gpu_transport: nccl moves the GPUs' gradients and needs "
                                            "device.backend=cuda (device.backend=cpu sends its ranks' gradients "
                                            "over MPI); use auto or mpi"));
#else
  CHECK_THAT(error_of(c), Catch::StartsWith("cluster.gpu_transport: nccl: this build has no NCCL"));
#endif
  c.cluster.gpu_transport = "mpi";
  CHECK(error_of(c).empty());
  c.device.backend = "cuda";
  CHECK(error_of(c).empty());
  CHECK(c.rank_grad_transport() == "mpi");  // asked for: host copies over MPI on the GPUs too
  for (const char* value : {"auto", "nccl"}) {
    c.cluster.gpu_transport = value;
    INFO(value);
#if MEGATRAIN_HAVE_NCCL
    CHECK(error_of(c).empty());
    CHECK(c.rank_grad_transport() == "nccl");
#else
    CHECK(c.rank_grad_transport() == "mpi");
    if (std::string(value) == "auto") CHECK(error_of(c).empty());
#endif
  }
}

TEST_CASE("missing files are reported with the key and the path", "[config]") {
  test::TempDir dir;
  struct Case {
    const char* expected;
    std::function<void(TrainConfig&)> spoil;
  };
  const Case cases[] = {
      {"data.train_files: no file matches '/nonexistent/*.bin'",
       [](TrainConfig& c) { c.data.train_files = "/nonexistent/*.bin"; }},
      {"data.validation_files: no file matches",
       [](TrainConfig& c) { c.data.validation_files = "/nonexistent/val*.bin"; }},
      {"data.tokenizer_file: file '/nonexistent/tokenizer.json' does not exist",
       [](TrainConfig& c) { c.data.tokenizer_file = "/nonexistent/tokenizer.json"; }},
      {"model.config_file: '/nonexistent' is neither", [](TrainConfig& c) { c.model.config_file = "/nonexistent"; }},
      {"model.model_name_or_path: '/nonexistent' is not a model directory",
       [](TrainConfig& c) { c.model.model_name_or_path = "/nonexistent"; }},
      {"train.resume_from_checkpoint: checkpoint directory '/nonexistent/ckpt' does not exist",
       [](TrainConfig& c) { c.train.resume_from_checkpoint = "/nonexistent/ckpt"; }},
  };
  for (const auto& k : cases) {
    TrainConfig c = valid_config(dir);
    k.spoil(c);
    INFO("expected: " << k.expected);
    CHECK_THAT(error_of(c), Catch::StartsWith(k.expected));
  }
  TrainConfig c = valid_config(dir);
  c.train.output_dir = dir.file("a_file");
  CHECK_THAT(error_of(c), Catch::Contains("train.output_dir") && Catch::Contains("is not a directory"));
  c = valid_config(dir);
  c.model.config_file = dir.file("config.json", "{}");
  CHECK(error_of(c).empty());        // reading it is storage/hf's job
  c.model.config_file = dir.path();  // a directory holding config.json
  CHECK(error_of(c).empty());
  c.train.resume_from_checkpoint = "latest";
  CHECK(error_of(c).empty());
}

TEST_CASE("the model keys make the ModelConfig, the demo model has ~15.7M parameters", "[config]") {
  TrainConfig c;
  const ModelConfig m = c.model_config_from_keys();
  CHECK(m.arch == Arch::llama);
  CHECK(m.num_hidden_layers == 8);
  CHECK(m.num_key_value_heads == 6);  // kv_heads 0 = heads
  CHECK(m.head_dim == 64);
  c.model.kv_heads = 2;
  CHECK(total_param_count(c.model_config_from_keys()) == 15735168);
  c.model.arch = "qwen2";
  CHECK(c.model_config_from_keys().attention_bias);
}

TEST_CASE("model keys: qwen3_moe with dense layers, MoE keys refused elsewhere by name", "[config][moe]") {
  TrainConfig c;
  c.model.arch = "qwen3_moe";
  c.model.num_experts = 4;
  c.model.moe_intermediate_size = 256;
  c.model.decoder_sparse_step = 2;
  c.model.mlp_only_layers = " 5, 1,5";
  const ModelConfig m = c.model_config_from_keys();
  CHECK(m.arch == Arch::qwen3_moe);
  CHECK(m.qk_norm);
  CHECK(m.moe_intermediate_size == 256);
  CHECK(m.intermediate_size == 1024);
  CHECK_FALSE(m.norm_topk_prob);  // transformers' Qwen3-MoE default
  CHECK(m.mlp_only_layers == std::vector<std::int64_t>{1, 5});
  for (std::int64_t l = 0; l < 8; ++l) CHECK(m.layer_is_moe(l) == (l == 3 || l == 7));
  c.model.mlp_only_layers = "1,x";
  CHECK_THROWS_WITH(c.model_config_from_keys(), Catch::Contains("model.mlp_only_layers"));
  c.model.mlp_only_layers = "9";
  CHECK_THROWS_WITH(c.model_config_from_keys(), Catch::Contains("mlp_only_layers holds 9"));
  c.model.mlp_only_layers = "";
  c.model.arch = "mixtral";
  CHECK_THROWS_WITH(c.model_config_from_keys(), Catch::Contains("model.moe_intermediate_size"));
  c.model.moe_intermediate_size = 0;
  CHECK_THROWS_WITH(c.model_config_from_keys(), Catch::Contains("model.decoder_sparse_step"));
  c.model.decoder_sparse_step = 1;
  CHECK(c.model_config_from_keys().norm_topk_prob);  // Mixtral always renormalises
  c.model.norm_topk_prob = true;
  CHECK_THROWS_WITH(c.model_config_from_keys(), Catch::Contains("model.norm_topk_prob"));
}

TEST_CASE("model keys: gpt_oss takes GptOssConfig's own parts, model.sliding_window is its alone", "[config][moe]") {
  TrainConfig c;
  c.model.arch = "gpt_oss";
  c.model.num_experts = 8;
  c.model.num_experts_per_tok = 2;
  c.model.layers = 5;
  ModelConfig m = c.model_config_from_keys();
  CHECK(m.attention_bias);
  CHECK(m.attention_sinks());
  CHECK(m.moe_biases());
  CHECK_FALSE(m.norm_topk_prob);  // the softmax runs over the k
  CHECK(m.moe_intermediate_size == m.intermediate_size);
  CHECK(m.sliding_window == 128);
  CHECK(m.sliding_layers == std::vector<std::int64_t>{0, 2, 4});
  c.model.sliding_window = 16;
  CHECK(c.model_config_from_keys().sliding_window == 16);
  c.model.arch = "llama";
  c.model.num_experts = 0;
  CHECK_THROWS_WITH(c.model_config_from_keys(), Catch::Contains("model.sliding_window") && Catch::Contains("gpt_oss"));
  c.model.arch = "mistral";  // Mistral: every layer slides
  m = c.model_config_from_keys();
  CHECK(m.sliding_layers.size() == 5);
  CHECK(m.attention_window() == 16);
  CHECK_FALSE(m.layers_differ());
  c.model.arch = "gpt_oss";
  c.model.sliding_window = 0;
  c.model.num_experts = 0;  // 0 = 8, as for the other families
  CHECK(c.model_config_from_keys().num_experts == 8);
  // The load-balancing loss is a training switch: it applies over a config.json's model too.
  ModelConfig file = c.model_config_from_keys();
  file.output_router_logits = false;
  c.model.output_router_logits = true;
  c.model.router_aux_loss_coef = 0.25;
  const ModelConfig switched = c.with_training_switches(file);
  CHECK(switched.output_router_logits);
  CHECK(switched.router_aux_loss_coef == 0.25);
  TrainConfig dense;
  dense.model.output_router_logits = true;
  CHECK_THROWS_WITH(dense.with_training_switches(dense.model_config_from_keys()),
                    Catch::Contains("model.output_router_logits"));
  CHECK_THROWS_WITH(dense.model_config_from_keys(), Catch::Contains("model.output_router_logits"));
}

TEST_CASE("the vocabulary check names the key and both sizes", "[config]") {
  TrainConfig c;
  const ModelConfig m = c.model_config_from_keys();
  CHECK_NOTHROW(TrainConfig::check_vocab(m, 4096, 4095));
  CHECK_NOTHROW(TrainConfig::check_vocab(m, 0, -1));
  CHECK_THROWS_WITH(TrainConfig::check_vocab(m, 50257, -1),
                    Catch::StartsWith("model.vocab_size") && Catch::Contains("4096") && Catch::Contains("50257"));
  CHECK_THROWS_WITH(TrainConfig::check_vocab(m, 0, 4096), Catch::Contains("token id 4096"));
}

TEST_CASE("the device budget comes from exactly one key and names it", "[config]") {
  TrainConfig c;
  CHECK(c.device_budget_bytes() == 1u << 30);  // the default: 1 GiB
  c.device.max_vram_gb = 64 / 1024.0;          // budgets below a GiB are fractions, exact for whole MiB
  CHECK(c.device_budget_bytes() == 64u << 20);
  CHECK(c.device_budget_name() == "device.max_vram_gb=0.0625");
  c.device.max_vram_gb = 1 / 1024.0;  // named with every digit, so it reads back as 1 MiB
  CHECK(c.device_budget_bytes() == 1u << 20);
  CHECK(c.device_budget_name() == "device.max_vram_gb=0.0009765625");
  c.device.max_vram_gb = 1.5;
  CHECK(c.device_budget_bytes() == 3u << 29);
  CHECK(c.device_budget_name() == "device.max_vram_gb=1.5");
  CHECK(c.copy_bandwidth_bytes_per_s() == 0.0);
  c.device.copy_bandwidth_gbps = 2.5;
  CHECK(c.copy_bandwidth_bytes_per_s() == 2.5e9);
  CHECK(c.prefetch_depth() == 1);
}

TEST_CASE("the thread budget is split explicitly", "[config][threads]") {
  TrainConfig c;
  // The development machine: compute gets both cores; the optimizer shares them with one thread.
  auto b = c.thread_budget(2);
  CHECK(b.total == 2);
  CHECK(b.blas == 2);
  CHECK(b.optimizer == 1);
  CHECK(b.copy == 1);
  CHECK(b.scheduler == 1);
  b = c.thread_budget(16);
  CHECK(b.blas == 16);
  CHECK(b.optimizer == 2);  // one per 8 cores on the CPU backend
  CHECK(b.copy == 2);
  CHECK(b.scheduler == 2);
  c.device.backend = "cuda";  // the GPU computes: every core for the optimizer
  CHECK(c.thread_budget(16).optimizer == 16);
  CHECK(c.thread_budget(2).optimizer == 2);
  c.device.backend = "cpu";
  c.threads.total = 8;
  c.threads.blas = 6;
  b = c.thread_budget(64);  // total overrides the hardware
  CHECK(b.total == 8);
  CHECK(b.blas == 6);
  CHECK(b.optimizer == 1);
  CHECK(c.thread_budget(64).optimizer == 1);
  c.threads.total = 9;
  CHECK(c.thread_budget(64).optimizer == 2);
  c.threads = ThreadsSection{4, 1, 3, 2, 1};
  b = c.thread_budget(2);
  CHECK((b.total == 4 && b.blas == 1 && b.optimizer == 3 && b.copy == 2 && b.scheduler == 1));
  CHECK(c.thread_budget(1).total == 4);
  c.threads = ThreadsSection{1, 0, 0, 0, 0};
  b = c.thread_budget(8);  // one thread: each pool gets one and they share it
  CHECK((b.blas == 1 && b.optimizer == 1 && b.copy == 1 && b.scheduler == 1));
  // A paced link models a full-duplex one: a copy worker per direction, also on 2 cores (they sleep for
  // the pacing); threads.copy still decides.
  c.threads = ThreadsSection{};
  c.device.copy_bandwidth_gbps = 0.5;
  CHECK(c.thread_budget(2).copy == 2);
  c.threads.copy = 1;
  CHECK(c.thread_budget(2).copy == 1);
}

TEST_CASE("enum keys parse to their values", "[config]") {
  TrainConfig c;
  CHECK(c.lr_schedule() == LrSchedule::cosine);
  CHECK(c.keep_intermediates() == KeepIntermediates::automatic);
  CHECK(c.optimizer_compression() == OptimizerCompression::none);
  c.device.keep_intermediates = "boundary_host";
  CHECK(c.keep_intermediates() == KeepIntermediates::boundary_host);
  c.device.keep_intermediates = "all_mapped";
  CHECK(c.keep_intermediates() == KeepIntermediates::all_mapped);
  // The host RAM a run is planned against: the key, else MemAvailable.
  CHECK(c.host_ram_source() == "MemAvailable");
  CHECK(c.host_ram_bytes() > 0);  // this machine's, which changes from one read to the next
  CHECK(mem_available_bytes() > 0);
  // Pinned once: every later plan of the run sees the same figure, however MemAvailable moves.
  c.pin_host_ram();
  REQUIRE(c.plan.host_ram_read_bytes > 0);
  const double pinned = c.plan.host_ram_read_bytes;
  CHECK(c.host_ram_bytes() == pinned);
  CHECK(c.host_ram_source() == "MemAvailable");
  c.plan.host_ram_read_bytes = 12345;
  c.pin_host_ram();  // a second pin keeps the first reading
  CHECK(c.host_ram_bytes() == 12345);
  c.plan.host_ram_gb = 2;  // the key wins over any reading
  CHECK(c.host_ram_source() == "plan.host_ram_gb");
  CHECK(c.host_ram_bytes() == 2.0 * 1073741824.0);
  CHECK(c.micro_batch_order() == MicroBatchOrder::interleaved);
  c.device.schedule = "sequential";
  CHECK(c.micro_batch_order() == MicroBatchOrder::sequential);
  c.device.schedule = "layer_major";
  CHECK(c.micro_batch_order() == MicroBatchOrder::layer_major);
  CHECK(c.train_jsonl_path() == "run/out/train.jsonl");
  c.log.train_jsonl = "x.jsonl";
  CHECK(c.train_jsonl_path() == "x.jsonl");
}

TEST_CASE("monitor and restart keys: bad values are reported with their key", "[config]") {
  test::TempDir dir;
  struct Case {
    const char* expected;
    std::function<void(TrainConfig&)> spoil;
  };
  const Case cases[] = {
      {"monitor.bind: must be an address", [](TrainConfig& c) { c.monitor.bind = ""; }},
      {"monitor.port: must be <= 65535, got 70000", [](TrainConfig& c) { c.monitor.port = 70000; }},
      {"monitor.port: must be >= 0", [](TrainConfig& c) { c.monitor.port = -1; }},
      {"monitor.watchdog_warn_s", [](TrainConfig& c) { c.monitor.watchdog_warn_s = -1; }},
      {"monitor.token_file: '/nonexistent/token' is not a readable file",
       [](TrainConfig& c) { c.monitor.token_file = "/nonexistent/token"; }},
      {"restart.max_restarts: must be >= 0", [](TrainConfig& c) { c.restart.max_restarts = -1; }},
      {"restart.window_s", [](TrainConfig& c) { c.restart.window_s = 0; }},
      {"restart.backoff_s", [](TrainConfig& c) { c.restart.backoff_s = -0.5; }},
      {"restart.per_actor: 'checkpointer:3' is not ACTOR:MAX",
       [](TrainConfig& c) { c.restart.per_actor = "loader:2,checkpointer:3"; }},
      {"restart.per_actor: 'compute:x': MAX must be an integer >= 0",
       [](TrainConfig& c) { c.restart.per_actor = "compute:x"; }},
      {"restart.per_actor: 'compute' is not ACTOR:MAX", [](TrainConfig& c) { c.restart.per_actor = "compute"; }},
  };
  for (const auto& k : cases) {
    TrainConfig c = valid_config(dir);
    k.spoil(c);
    INFO(k.expected);
    CHECK_THAT(error_of(c), Catch::StartsWith(k.expected));
  }
  TrainConfig c = valid_config(dir);
  c.restart.per_actor = "loader:20,compute:2";
  CHECK(error_of(c).empty());
  CHECK(c.max_restarts_of("compute") == 2);
  CHECK(c.max_restarts_of("loader") == 20);
  CHECK(c.max_restarts_of("optimizer") == c.restart.max_restarts);
}

TEST_CASE("train.master_weights=auto splits the masters where the tie bit has an exact v to live in",
          "[config][master_halves]") {
  TrainConfig c;
  CHECK(c.master_weights() == MasterWeights::automatic);
  CHECK_FALSE(c.split_masters());  // fp32: the masters are the streamed weights
  c.train.bf16 = true;
  CHECK(c.split_masters());
  c.train.optimizer_compression = "int8";
  CHECK_FALSE(c.split_masters());  // v is quantised
  c.train.optimizer_compression = "none";
  c.train.offload_dir = "/tmp/x";
  CHECK_FALSE(c.split_masters());  // v outside the tiles
  c.train.offload_dir.clear();
  c.train.master_weights = "fp32";
  CHECK_FALSE(c.split_masters());
  c.train.master_weights = "split";
  CHECK(c.split_masters());
}

TEST_CASE("train.gradient_buffer=auto drops the accumulators only where that costs no second pass",
          "[config][stage_gradients]") {
  TrainConfig c;
  CHECK(c.gradient_buffer() == GradientBuffer::automatic);
  CHECK_FALSE(c.stage_gradients());  // max_grad_norm 1: a second pass would be needed
  c.train.max_grad_norm = 0.0;
  CHECK(c.stage_gradients());
  CHECK(c.stage_gradient_passes() == 1);
  c.train.gradient_accumulation_steps = 2;
  CHECK_FALSE(c.stage_gradients());  // it would change the schedule (layer-major): only when only it fits
  CHECK(c.stage_gradients_unsupported().empty());
  CHECK(c.micro_batch_order() == MicroBatchOrder::interleaved);
  c.train.gradient_buffer = "stage";  // several micro-batches: layer-major, whatever device.schedule says
  CHECK(c.stage_gradients());
  CHECK(c.micro_batch_order() == MicroBatchOrder::layer_major);
  c.device.schedule = "sequential";
  CHECK(c.micro_batch_order() == MicroBatchOrder::layer_major);
  c.device.schedule = "interleaved";
  c.train.gradient_buffer = "auto";
  c.train.gradient_accumulation_steps = 1;
  CHECK(c.micro_batch_order() == MicroBatchOrder::interleaved);
  c.cluster.ranks = 2;
  CHECK_FALSE(c.stage_gradients());  // unsharded ranks: every rank would hold every stage's sum
  CHECK(c.stage_gradients_unsupported().find("cluster.shard_state") != std::string::npos);
  c.cluster.shard_state = true;  // each stage's owner sums its rounds: the same rule as one rank
  CHECK(c.stage_gradients_unsupported().empty());
  CHECK(c.stage_gradients());
  c.train.gradient_accumulation_steps = 2;
  CHECK_FALSE(c.stage_gradients());
  c.train.gradient_buffer = "stage";
  CHECK(c.micro_batch_order() == MicroBatchOrder::layer_major);
  c.train.gradient_buffer = "auto";
  c.train.gradient_accumulation_steps = 1;
  c.train.max_grad_norm = 1.0;
  CHECK_FALSE(c.stage_gradients());
  c.train.max_grad_norm = 0.0;
  c.cluster.shard_state = false;
  c.cluster.ranks = 1;
  c.train.gradient_buffer = "stage";
  c.train.max_grad_norm = 1.0;
  CHECK(c.stage_gradients());
  CHECK(c.stage_gradient_passes() == 2);
  c.train.gradient_buffer = "model";
  CHECK_FALSE(c.stage_gradients());
}
