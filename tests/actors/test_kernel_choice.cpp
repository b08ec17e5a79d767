// The run's kernel choice (plan/kernel_choice.hpp): the cache file round-trips and a damaged one is
// ignored with a warning, never fatal; the order of the sources (forced, this process, the checkpoint,
// the cache, the probe); where the cache lives; the probe's shapes. The resume through the node binary
// is in test_checkpoint_binary.cpp.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "kernels/cpu/bf16_pairs.hpp"
#include "plan/kernel_choice.hpp"
#include "tests/actors/run_dir_fixture.hpp"

namespace fs = std::filesystem;
using mt::cpu::AttnProducts;
using mt::cpu::Bf16Gemm;
using mt::cpu::Fp32Gemm;
using mt::cpu::Fp32GemmChoice;
using mt::cpu::LinearProduct;
using namespace mt::plan;

namespace {

KernelCacheKey key(int threads = 2, const std::string& shapes = "512x384x384") {
  KernelCacheKey k;
  k.cpu = "Test CPU (family 25 model 17)";
  k.isa = "avx2 avx512f avx512_bf16 onednn:avx512_core_bf16";
  k.onednn = "2.6.3";
  k.blas = "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64, core Zen";
  k.threads = threads;
  k.shapes = shapes;
  return k;
}

KernelCacheEntry entry(const KernelCacheKey& k, Bf16Gemm g, double onednn_s = 0.01, double widened_s = 0.02) {
  KernelCacheEntry e;
  e.key = k;
  e.bf16_gemm = g;
  e.onednn_s = onednn_s;
  e.widened_s = widened_s;
  e.probed_unix = 1.7e9;
  return e;
}

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// Probes that count their calls and return fixed verdicts.
struct FakeProbe {
  int calls = 0, attention_calls = 0, fp32_calls = 0;
  mt::cpu::Fp32GemmChoice fp32;  // oneDNN for all three unless a test says otherwise
  std::function<mt::cpu::Fp32Probe()> fp32_fn() {
    return [this] {
      ++fp32_calls;
      mt::cpu::Fp32Probe p;
      p.shapes = {{512, 384, 384}};
      p.threads = 2;
      p.rounds = 2;
      for (int i = 0; i < mt::cpu::kLinearProducts; ++i) {
        p.onednn_s[i] = 0.010;
        p.openblas_s[i] = fp32.lib[i] == Fp32Gemm::openblas ? 0.005 : 0.012;
      }
      p.wall_s = 0.07;
      p.choice = fp32;
      return p;
    };
  }
  Bf16Gemm choice = Bf16Gemm::onednn;
  AttnProducts attention = AttnProducts::bf16_pairs;
  std::function<mt::cpu::AttnProbe()> attention_fn() {
    return [this] {
      ++attention_calls;
      mt::cpu::AttnProbe p;
      p.shape.q_heads = 6, p.shape.kv_heads = 2, p.shape.head_dim = 64, p.shape.seq = 512;
      p.threads = 2;
      p.rounds = 3;
      p.pairs_available = true;
      p.fp32_s = 0.016;
      p.pairs_s = attention == AttnProducts::bf16_pairs ? 0.010 : 0.020;
      p.wall_s = 0.09;
      p.choice = attention;
      return p;
    };
  }
  std::function<mt::cpu::Bf16Probe()> fn() {
    return [this] {
      ++calls;
      mt::cpu::Bf16Probe p;
      p.shapes = {{512, 384, 384}};
      p.threads = 2;
      p.products = 3;
      p.rounds = 2;
      p.onednn_available = true;
      p.onednn_s = choice == Bf16Gemm::onednn ? 0.010 : 0.030;
      p.widened_s = 0.019;
      p.wall_s = 0.08;
      p.choice = choice;
      return p;
    };
  }
};

KernelChoiceInputs inputs(const fs::path& cache, FakeProbe& probe) {
  KernelChoiceInputs in;
  in.onednn_available = true;
  in.cache_file = cache;
  in.key = key();
  in.fp32_probe = probe.fp32_fn();
  in.probe = probe.fn();
  in.attention_probe = probe.attention_fn();
  in.now_unix = [] { return 1.7e9; };
  return in;
}

// Sets an environment variable for a scope, restoring it after.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~EnvVar() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("kernel choice cache: entries round-trip, keyed by every field", "[actors][kernel_choice]") {
  mt::test::TempDir dir("kcache");
  const fs::path file = dir.path / "megatrain" / "kernel_choices.json";
  std::string warning;
  CHECK_FALSE(read_kernel_cache(file, key(), warning));  // no file: no entry, no warning
  CHECK(warning.empty());
  REQUIRE(write_kernel_cache(file, entry(key(), Bf16Gemm::onednn, 0.011, 0.021), warning));
  CHECK(warning.empty());
  REQUIRE(write_kernel_cache(file, entry(key(4), Bf16Gemm::widened), warning));
  const auto a = read_kernel_cache(file, key(), warning);
  REQUIRE(a);
  CHECK(a->bf16_gemm == Bf16Gemm::onednn);
  CHECK(a->onednn_s == 0.011);
  CHECK(a->widened_s == 0.021);
  CHECK(a->probed_unix == 1.7e9);
  const auto b = read_kernel_cache(file, key(4), warning);
  REQUIRE(b);
  CHECK(b->bf16_gemm == Bf16Gemm::widened);
  // Any field of the key that differs misses.
  CHECK_FALSE(read_kernel_cache(file, key(2, "1024x768x3072"), warning));
  KernelCacheKey k = key();
  k.onednn = "3.1.0";
  CHECK_FALSE(read_kernel_cache(file, k, warning));
  k = key();
  k.cpu = "Another CPU";
  CHECK_FALSE(read_kernel_cache(file, k, warning));
  k = key();
  k.isa = "avx2";
  CHECK_FALSE(read_kernel_cache(file, k, warning));
  k = key();
  k.blas = "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64, core Haswell";  // OPENBLAS_CORETYPE
  CHECK_FALSE(read_kernel_cache(file, k, warning));
  CHECK(warning.empty());
  // Rewriting a key replaces its entry, keeping the others.
  REQUIRE(write_kernel_cache(file, entry(key(), Bf16Gemm::widened), warning));
  CHECK(read_kernel_cache(file, key(), warning)->bf16_gemm == Bf16Gemm::widened);
  CHECK(read_kernel_cache(file, key(4), warning)->bf16_gemm == Bf16Gemm::widened);
  std::ifstream in(file);
  const auto j = nlohmann::json::parse(in);
  CHECK(j["format"] == "megatrain-kernel-choices");
  CHECK(j["entries"].size() == 2);
  for (const auto& e : fs::directory_iterator(file.parent_path()))  // no temporary file left
    CHECK(e.path().filename() == "kernel_choices.json");
}

TEST_CASE("kernel choice cache: a damaged or unreadable file is ignored with a warning", "[actors][kernel_choice]") {
  mt::test::TempDir dir("kcorrupt");
  const fs::path file = dir.path / "kernel_choices.json";
  std::string warning;
  for (const std::string& text :
       {std::string("{\"format\": \"megatrain-kernel-ch"), std::string("[1, 2, 3]"),
        std::string("{\"format\": \"megatrain-kernel-choices\", \"format_version\": 99, \"entries\": []}"),
        std::string("{\"format\": \"megatrain-kernel-choices\", \"format_version\": 1, \"entries\": [{\"cpu\": 1}]}"),
        std::string("{\"format\": \"megatrain-kernel-choices\", \"format_version\": 1, \"entries\": [{\"cpu\": \"c\", "
                    "\"isa\": \"i\", \"onednn\": \"o\", \"threads\": 2, \"shapes\": \"s\", \"bf16_gemm\": \"fast\"}]}"),
        std::string("\x01\x02\xff")}) {
    INFO(text);
    write_text(file, text);
    CHECK_FALSE(read_kernel_cache(file, key(), warning));
    CHECK_THAT(warning, Catch::Contains("ignoring the kernel choice cache " + file.string()));
    CHECK(warning.find('\n') == std::string::npos);  // one line
  }
  // A damaged file is replaced by the next write.
  REQUIRE(write_kernel_cache(file, entry(key(), Bf16Gemm::onednn), warning));
  CHECK(read_kernel_cache(file, key(), warning)->bf16_gemm == Bf16Gemm::onednn);
  CHECK(warning.empty());
  // A directory where the file should be: cannot be read or written, only warned about.
  const fs::path dirfile = dir.path / "adir";
  fs::create_directories(dirfile / "x");
  CHECK_FALSE(read_kernel_cache(dirfile, key(), warning));
  CHECK_FALSE(warning.empty());
  CHECK_FALSE(write_kernel_cache(dirfile, entry(key(), Bf16Gemm::onednn), warning));
  CHECK_THAT(warning, Catch::Contains("cannot write the kernel choice cache " + dirfile.string()));
  // Through the decision: the probe runs, the run goes on, the warning is a note.
  FakeProbe probe;
  write_text(file, "not json");
  KernelChoiceInputs in = inputs(file, probe);
  const KernelChoice c = decide_kernel_choice(in);
  CHECK(probe.calls == 1);
  CHECK(c.source == "probe");
  REQUIRE(c.notes.size() == 1);
  CHECK_THAT(c.notes[0], Catch::Contains("ignoring the kernel choice cache"));
  CHECK(read_kernel_cache(file, key(), warning)->bf16_gemm == Bf16Gemm::onednn);  // and rewritten
  in.cache_file = dirfile;
  const KernelChoice d = decide_kernel_choice(in);
  CHECK(d.source == "probe");
  CHECK_THAT(d.detail, Catch::EndsWith("not cached"));
  CHECK_FALSE(d.notes.empty());
}

TEST_CASE("kernel choice: forced, then this process, the checkpoint, the cache, the probe", "[actors][kernel_choice]") {
  mt::test::TempDir dir("korder");
  const fs::path file = dir.path / "kernel_choices.json";
  FakeProbe probe;

  SECTION("nothing known: the probe, then cached, then the cache without a probe") {
    const KernelChoice c = decide_kernel_choice(inputs(file, probe));
    CHECK(probe.calls == 1);
    CHECK(c.applies);
    CHECK(c.source == "probe");
    CHECK(c.bf16_gemm == Bf16Gemm::onednn);
    REQUIRE(c.probe);
    CHECK_THAT(c.line(), Catch::StartsWith("bf16 products: onednn (probe: oneDNN's bf16 matmul at 1.90x") &&
                             Catch::Contains("cached in " + file.string()));
    CHECK(c.cache_file == file.string());
    CHECK(c.json()["bf16_gemm"]["path"] == "onednn");
    CHECK(c.json()["bf16_gemm"]["source"] == "probe");
    CHECK(c.json()["bf16_gemm"]["probe"]["speedup"].get<double>() == Approx(1.9));
    const KernelChoice again = decide_kernel_choice(inputs(file, probe));
    CHECK(probe.calls == 1);
    CHECK(again.source == "cache");
    CHECK(again.bf16_gemm == Bf16Gemm::onednn);
    CHECK_THAT(again.line(), Catch::Contains("cached in " + file.string()));
  }
  SECTION("the probe's widened verdict is cached as such") {
    probe.choice = Bf16Gemm::widened;
    CHECK(decide_kernel_choice(inputs(file, probe)).bf16_gemm == Bf16Gemm::widened);
    CHECK(decide_kernel_choice(inputs(file, probe)).source == "cache");
    CHECK(decide_kernel_choice(inputs(file, probe)).bf16_gemm == Bf16Gemm::widened);
    CHECK(probe.calls == 1);
  }
  SECTION("the checkpoint's path wins over the cache and the probe") {
    std::string w;
    REQUIRE(write_kernel_cache(file, entry(key(), Bf16Gemm::onednn), w));
    KernelChoiceInputs in = inputs(file, probe);
    in.checkpoint = {{"bf16_gemm", "widened"}};
    const KernelChoice c = decide_kernel_choice(in);
    CHECK(c.source == "checkpoint");
    CHECK(c.bf16_gemm == Bf16Gemm::widened);
    CHECK(c.line() == "bf16 products: widened (from the checkpoint)");
    CHECK(c.notes.empty());
    CHECK(probe.calls == 0);
  }
  SECTION("a checkpoint path this CPU cannot run: said, and the other path") {
    KernelChoiceInputs in = inputs(file, probe);
    in.onednn_available = false;
    in.checkpoint = {{"bf16_gemm", "onednn"}};
    const KernelChoice c = decide_kernel_choice(in);
    CHECK(c.source == "checkpoint");
    CHECK(c.bf16_gemm == Bf16Gemm::widened);
    CHECK_THAT(c.detail, Catch::Contains("cannot run"));
    REQUIRE(c.notes.size() == 1);
    CHECK_THAT(c.notes[0], Catch::Contains("continuing on the widened path"));
    CHECK(probe.calls == 0);
  }
  SECTION("an older checkpoint (no field) or a malformed one: measured as a new run") {
    KernelChoiceInputs in = inputs(file, probe);
    in.checkpoint = nlohmann::json::object();
    CHECK(decide_kernel_choice(in).source == "probe");
    CHECK(probe.calls == 1);
    fs::remove(file);
    in.checkpoint = {{"bf16_gemm", 3}};
    const KernelChoice c = decide_kernel_choice(in);
    CHECK(c.source == "probe");
    CHECK(probe.calls == 2);
    REQUIRE(c.notes.size() == 1);
    CHECK_THAT(c.notes[0], Catch::Contains("kernel_choices.bf16_gemm is 3"));
  }
  SECTION("MEGATRAIN_BF16_GEMM wins over everything, and says what it changes") {
    std::string w;
    REQUIRE(write_kernel_cache(file, entry(key(), Bf16Gemm::onednn), w));
    KernelChoiceInputs in = inputs(file, probe);
    in.forced = Bf16Gemm::widened;
    in.process = Bf16Gemm::onednn;
    in.checkpoint = {{"bf16_gemm", "onednn"}};
    const KernelChoice c = decide_kernel_choice(in);
    CHECK(c.source == "forced");
    CHECK(c.bf16_gemm == Bf16Gemm::widened);
    CHECK(c.line() == "bf16 products: widened (forced by MEGATRAIN_BF16_GEMM)");
    REQUIRE(c.notes.size() == 1);
    CHECK_THAT(c.notes[0], Catch::Contains("bits differ"));
    CHECK(probe.calls == 0);
    // Forced onednn where oneDNN has no bf16 kernels: widened, said.
    in.forced = Bf16Gemm::onednn;
    in.onednn_available = false;
    in.checkpoint = nullptr;
    const KernelChoice d = decide_kernel_choice(in);
    CHECK(d.bf16_gemm == Bf16Gemm::widened);
    CHECK_THAT(d.detail, Catch::Contains("no bf16 kernels"));
  }
  SECTION("a path fixed earlier in this process stays") {
    KernelChoiceInputs in = inputs(file, probe);
    in.process = Bf16Gemm::widened;
    in.checkpoint = {{"bf16_gemm", "onednn"}};
    const KernelChoice c = decide_kernel_choice(in);
    CHECK(c.source == "process");
    CHECK(c.bf16_gemm == Bf16Gemm::widened);
    REQUIRE(c.notes.size() == 1);
    CHECK_THAT(c.notes[0], Catch::Contains("this process already runs widened"));
    CHECK(probe.calls == 0);
  }
  SECTION("no oneDNN bf16 kernels and nothing recorded: widened, nothing probed or cached") {
    KernelChoiceInputs in = inputs(file, probe);
    in.onednn_available = false;
    const KernelChoice c = decide_kernel_choice(in);
    CHECK(c.bf16_gemm == Bf16Gemm::widened);
    CHECK(c.source == "unavailable");
    CHECK(probe.calls == 0);
    std::string w;
    const auto e = read_kernel_cache(file, key(), w);  // the fp32 choice alone
    REQUIRE(e);
    CHECK(e->fp32_gemm);
    CHECK_FALSE(e->bf16_gemm);
  }
  SECTION("no cache directory: probed every time, said") {
    KernelChoiceInputs in = inputs("", probe);
    CHECK_THAT(decide_kernel_choice(in).detail, Catch::Contains("not cached"));
    decide_kernel_choice(in);
    CHECK(probe.calls == 2);
  }
}

TEST_CASE("kernel choice cache: XDG_CACHE_HOME, else ~/.cache", "[actors][kernel_choice]") {
  {
    EnvVar xdg("XDG_CACHE_HOME", "/var/tmp/xdg");
    EnvVar home("HOME", "/home/someone");
    CHECK(kernel_cache_file() == fs::path("/var/tmp/xdg/megatrain/kernel_choices.json"));
  }
  {
    EnvVar xdg("XDG_CACHE_HOME", "relative/dir");  // the spec ignores relative paths
    EnvVar home("HOME", "/home/someone");
    CHECK(kernel_cache_file() == fs::path("/home/someone/.cache/megatrain/kernel_choices.json"));
  }
  {
    EnvVar xdg("XDG_CACHE_HOME", nullptr);
    EnvVar home("HOME", nullptr);
    CHECK(kernel_cache_file().empty());
  }
}

TEST_CASE("kernel choice: the probe's shapes are the run's linear layers", "[actors][kernel_choice]") {
  mt::ModelConfig llama;
  llama.arch = mt::Arch::llama;
  llama.hidden_size = 384;
  llama.num_attention_heads = 6;
  llama.num_key_value_heads = 2;
  llama.head_dim = 64;
  llama.intermediate_size = 1024;
  llama.vocab_size = 4096;
  const auto s = bf16_probe_shapes(llama, 512, 512);
  REQUIRE(s.size() == 5);
  CHECK((s[0].rows == 512 && s[0].in == 384 && s[0].out == 384));   // q
  CHECK((s[2].in == 384 && s[2].out == 1024));                      // MLP up
  CHECK((s[3].in == 1024 && s[3].out == 384));                      // MLP down
  CHECK((s[4].rows == 512 && s[4].in == 384 && s[4].out == 4096));  // LM head
  mt::ModelConfig gpt2 = llama;
  gpt2.arch = mt::Arch::gpt2;
  CHECK(bf16_probe_shapes(gpt2, 64, 0)[0].out == 3 * 384);
  CHECK(bf16_probe_shapes(gpt2, 64, 0).size() == 4);
  mt::ModelConfig mixtral = llama;  // 8 experts of width 512, top-2: an expert's share of 512 rows is 128
  mixtral.num_experts = 8;
  mixtral.num_experts_per_tok = 2;
  mixtral.moe_intermediate_size = 512;
  const auto m = bf16_probe_shapes(mixtral, 512, 0);
  REQUIRE(m.size() == 4);
  CHECK((m[2].rows == 128 && m[2].in == 384 && m[2].out == 512));
  CHECK((m[3].rows == 128 && m[3].in == 512 && m[3].out == 384));
  const mt::AttnShape a = attention_probe_shape(llama, 4096);  // cut to 1024 positions
  CHECK((a.q_heads == 6 && a.kv_heads == 2 && a.head_dim == 64 && a.seq == 1024 && a.batch == 1));
  CHECK((a.q_stride == 384 && a.kv_stride == 128 && a.o_stride == 384));
  CHECK(attention_probe_shape(llama, 100).seq == 100);
  const KernelCacheKey k = kernel_cache_key(3, s, a);
  CHECK(k.threads == 3);
  CHECK(k.shapes == "512x384x384, 512x384x384, 512x384x1024, 512x1024x384, 512x384x4096, attention 6x2x64 at 1024");
  CHECK_FALSE(k.cpu.empty());
  CHECK_THAT(k.isa, Catch::Contains("onednn:"));
  CHECK(k.onednn == mt::cpu::onednn_version());
}

TEST_CASE("kernel choice: the attention's products, forced, the checkpoint, the cache, the probe",
          "[actors][kernel_choice]") {
  mt::test::TempDir dir("kattn");
  const fs::path file = dir.path / "kernel_choices.json";
  FakeProbe probe;
  auto with_pairs = [&] {
    KernelChoiceInputs in = inputs(file, probe);
    in.pairs_available = true;
    return in;
  };

  SECTION("nothing known: both probed, one entry cached with both, then both from the cache") {
    const KernelChoice c = decide_kernel_choice(with_pairs());
    CHECK((probe.calls == 1 && probe.attention_calls == 1));
    CHECK(c.attention == AttnProducts::bf16_pairs);
    CHECK(c.attention_source == "probe");
    CHECK_THAT(c.attention_line(),
               Catch::StartsWith("attention products: pairs (probe: bf16 pairs at 1.60x fp32's speed") &&
                   Catch::Contains("cached in " + file.string()));
    CHECK_THAT(c.line(), Catch::Contains("cached in " + file.string()));
    CHECK(c.json()["bf16_attention"]["path"] == "pairs");
    CHECK(c.json()["bf16_attention"]["probe"]["speedup"].get<double>() == Approx(1.6));
    std::string w;
    const auto e = read_kernel_cache(file, key(), w);
    REQUIRE(e);
    CHECK(e->bf16_gemm == Bf16Gemm::onednn);
    CHECK(e->bf16_attention == AttnProducts::bf16_pairs);
    CHECK(e->attention_fp32_s == 0.016);
    const KernelChoice again = decide_kernel_choice(with_pairs());
    CHECK((probe.calls == 1 && probe.attention_calls == 1));
    CHECK(again.attention_source == "cache");
    CHECK(again.attention == AttnProducts::bf16_pairs);
  }
  SECTION("an entry cached before the attention was chosen: only the attention is probed, and added") {
    std::string w;
    REQUIRE(write_kernel_cache(file, entry(key(), Bf16Gemm::widened), w));
    probe.attention = AttnProducts::fp32;
    const KernelChoice c = decide_kernel_choice(with_pairs());
    CHECK((probe.calls == 0 && probe.attention_calls == 1));
    CHECK(c.source == "cache");
    CHECK(c.attention == AttnProducts::fp32);
    CHECK_THAT(c.attention_detail, Catch::Contains("pairs need 1.10x"));
    const auto e = read_kernel_cache(file, key(), w);
    REQUIRE(e);
    CHECK(e->bf16_gemm == Bf16Gemm::widened);  // kept
    CHECK(e->bf16_attention == AttnProducts::fp32);
  }
  SECTION("no AVX512-BF16: fp32, nothing probed for it") {
    const KernelChoice c = decide_kernel_choice(inputs(file, probe));
    CHECK(c.attention == AttnProducts::fp32);
    CHECK(c.attention_source == "unavailable");
    CHECK(probe.attention_calls == 0);
    std::string w;
    CHECK_FALSE(read_kernel_cache(file, key(), w)->bf16_attention);
  }
  SECTION("the checkpoint's choice wins over the cache and the probe; an older checkpoint ran fp32") {
    KernelChoiceInputs in = with_pairs();
    in.checkpoint = {{"bf16_gemm", "onednn"}, {"bf16_attention", "pairs"}};
    KernelChoice c = decide_kernel_choice(in);
    CHECK((c.attention_source == "checkpoint" && c.attention == AttnProducts::bf16_pairs));
    in.checkpoint = {{"bf16_gemm", "onednn"}};  // written before the pair products existed
    c = decide_kernel_choice(in);
    CHECK((c.attention_source == "checkpoint" && c.attention == AttnProducts::fp32));
    CHECK((probe.calls == 0 && probe.attention_calls == 0));
    // The event's form (what rank 0 sends the other ranks) reads the same.
    in.checkpoint = {{"bf16_gemm", {{"path", "widened"}, {"source", "probe"}}},
                     {"bf16_attention", {{"path", "pairs"}, {"source", "probe"}}}};
    c = decide_kernel_choice(in);
    CHECK((c.source == "checkpoint" && c.bf16_gemm == Bf16Gemm::widened));
    CHECK((c.attention_source == "checkpoint" && c.attention == AttnProducts::bf16_pairs));
    CHECK(c.notes.empty());
    // Pairs recorded on a CPU without them: said, and fp32.
    in.pairs_available = false;
    c = decide_kernel_choice(in);
    CHECK(c.attention == AttnProducts::fp32);
    REQUIRE(c.notes.size() == 1);
    CHECK_THAT(c.notes[0], Catch::Contains("continuing on fp32 products"));
    // A malformed record: said, and measured again.
    in.pairs_available = true;
    in.checkpoint = {{"bf16_gemm", "onednn"}, {"bf16_attention", "fast"}};
    c = decide_kernel_choice(in);
    CHECK(c.attention_source == "probe");
    REQUIRE(c.notes.size() == 1);
    CHECK_THAT(c.notes[0], Catch::Contains("kernel_choices.bf16_attention is \"fast\""));
  }
  SECTION("MEGATRAIN_BF16_ATTENTION wins over everything, and says what it changes") {
    KernelChoiceInputs in = with_pairs();
    in.attention_forced = AttnProducts::fp32;
    in.checkpoint = {{"bf16_gemm", "onednn"}, {"bf16_attention", "pairs"}};
    KernelChoice c = decide_kernel_choice(in);
    CHECK((c.attention_source == "forced" && c.attention == AttnProducts::fp32));
    CHECK(c.attention_line() == "attention products: fp32 (forced by MEGATRAIN_BF16_ATTENTION)");
    REQUIRE(c.notes.size() == 1);
    CHECK_THAT(c.notes[0], Catch::Contains("bits differ"));
    in.attention_forced = AttnProducts::bf16_pairs;
    in.pairs_available = false;
    in.checkpoint = nullptr;
    c = decide_kernel_choice(in);
    CHECK(c.attention == AttnProducts::fp32);
    CHECK_THAT(c.attention_detail, Catch::Contains("no AVX512-BF16"));
    CHECK(probe.attention_calls == 0);
  }
}

TEST_CASE("kernel choice: the attention's probe measures both products and picks by the margin",
          "[actors][kernel_choice]") {
  mt::AttnShape a;
  a.batch = 1, a.seq = 256, a.q_heads = 4, a.kv_heads = 2, a.head_dim = 32;
  const mt::cpu::AttnProbe p = mt::cpu::probe_bf16_attention(a, 2, 0.05);
  CHECK(p.shape.seq == 256);
  CHECK(p.rounds >= 1);
  CHECK(p.fp32_s > 0);
  CHECK(p.pairs_available == mt::cpu::bf16_pairs_available());
  if (p.pairs_available) {
    CHECK(p.pairs_s > 0);
    CHECK((p.choice == AttnProducts::bf16_pairs) == (p.fp32_s >= mt::cpu::kBf16PairsMargin * p.pairs_s));
  } else {
    CHECK(p.choice == AttnProducts::fp32);
  }
}

namespace {

Fp32GemmChoice weight_on_openblas() {
  Fp32GemmChoice c;
  c[LinearProduct::backward_weight] = Fp32Gemm::openblas;
  return c;
}

}  // namespace

TEST_CASE("kernel choice: the fp32 products' libraries, forced, this process, the checkpoint, the cache, the probe",
          "[actors][kernel_choice]") {
  mt::test::TempDir dir("kfp32");
  const fs::path file = dir.path / "kernel_choices.json";
  FakeProbe probe;
  probe.fp32 = weight_on_openblas();
  auto fp32_only = [&] {
    KernelChoiceInputs in = inputs(file, probe);
    in.bf16 = false;
    return in;
  };

  SECTION("an fp32 run, nothing known: probed, cached, then from the cache; nothing of bf16 chosen") {
    const KernelChoice c = decide_kernel_choice(fp32_only());
    CHECK((probe.fp32_calls == 1 && probe.calls == 0 && probe.attention_calls == 0));
    CHECK(c.applies);
    CHECK_FALSE(c.bf16);
    CHECK(c.fp32_source == "probe");
    CHECK(c.fp32_gemm == weight_on_openblas());
    CHECK_THAT(c.fp32_line(), Catch::StartsWith("fp32 products: forward onednn, backward_input onednn, "
                                                "backward_weight openblas (probe: OpenBLAS at 0.83x forward, 0.83x "
                                                "backward_input, 2.00x backward_weight of oneDNN's speed") &&
                                  Catch::Contains("OpenBLAS needs 1.10x") &&
                                  Catch::Contains("cached in " + file.string()));
    const nlohmann::json j = c.json();
    CHECK_FALSE(j.contains("bf16_gemm"));
    CHECK(j["fp32_gemm"]["backward_weight"] == "openblas");
    CHECK(j["fp32_gemm"]["forward"] == "onednn");
    CHECK(j["fp32_gemm"]["source"] == "probe");
    CHECK(j["fp32_gemm"]["probe"]["openblas_s"][2].get<double>() == 0.005);
    std::string w;
    const auto e = read_kernel_cache(file, key(), w);
    REQUIRE(e);
    CHECK(e->fp32_gemm == weight_on_openblas());
    CHECK(e->fp32_onednn_s[2] == 0.010);
    CHECK(e->fp32_openblas_s[2] == 0.005);
    CHECK_FALSE(e->bf16_gemm);
    const KernelChoice again = decide_kernel_choice(fp32_only());
    CHECK(probe.fp32_calls == 1);
    CHECK(again.fp32_source == "cache");
    CHECK(again.fp32_gemm == weight_on_openblas());
    // A bf16 run of the same model then adds its own choices to the entry, the fp32 one from the cache.
    const KernelChoice b = decide_kernel_choice(inputs(file, probe));
    CHECK((probe.fp32_calls == 1 && probe.calls == 1));
    CHECK(b.fp32_source == "cache");
    CHECK(read_kernel_cache(file, key(), w)->fp32_gemm == weight_on_openblas());
    CHECK(read_kernel_cache(file, key(), w)->bf16_gemm == Bf16Gemm::onednn);
  }
  SECTION("layer shapes on the other library: probed, cached and recorded with the choice") {
    probe.fp32.shapes.push_back({LinearProduct::forward, 384, 1024, Fp32Gemm::openblas});
    const KernelChoice c = decide_kernel_choice(fp32_only());
    CHECK_THAT(c.fp32_line(), Catch::StartsWith("fp32 products: forward onednn, backward_input onednn, "
                                                "backward_weight openblas; forward 1024x384 openblas (probe: "));
    const nlohmann::json j = c.json()["fp32_gemm"];
    REQUIRE(j["shapes"].size() == 1);
    CHECK(j["shapes"][0] == nlohmann::json{{"product", "forward"}, {"in", 384}, {"out", 1024}, {"lib", "openblas"}});
    const KernelChoice again = decide_kernel_choice(fp32_only());
    CHECK((again.fp32_source == "cache" && again.fp32_gemm == probe.fp32));
    KernelChoiceInputs in = fp32_only();
    in.resuming = true;
    in.checkpoint = {{"fp32_gemm", j}};  // the event's form, as a rank or a run state carries it
    const KernelChoice r = decide_kernel_choice(in);
    CHECK((r.fp32_source == "checkpoint" && r.fp32_gemm == probe.fp32));
    in.checkpoint["fp32_gemm"]["shapes"][0]["lib"] = "mkl";  // malformed: said, and taken as never recorded
    const KernelChoice m = decide_kernel_choice(in);
    CHECK(m.fp32_source == "cache");
    CHECK_FALSE(m.notes.empty());
  }
  SECTION("the choice is fixed before the bf16 probe runs (its widened path runs on it)") {
    KernelChoiceInputs in = inputs(file, probe);
    std::vector<std::string> order;
    in.fix_fp32 = [&](const Fp32GemmChoice& c) {
      order.push_back("fix " + c.str());
      return c;
    };
    auto bf16_probe = probe.fn();
    in.probe = [&] {
      order.push_back("bf16 probe");
      return bf16_probe();
    };
    decide_kernel_choice(in);
    REQUIRE(order.size() == 2);
    CHECK(order[0] == "fix forward onednn, backward_input onednn, backward_weight openblas");
    CHECK(order[1] == "bf16 probe");
  }
  SECTION("what the process fixes is what is said") {
    KernelChoiceInputs in = fp32_only();
    in.fix_fp32 = [](const Fp32GemmChoice&) { return Fp32GemmChoice::all(Fp32Gemm::onednn); };
    const KernelChoice c = decide_kernel_choice(in);
    CHECK(c.fp32_gemm == Fp32GemmChoice::all(Fp32Gemm::onednn));
    REQUIRE(c.notes.size() == 1);
    CHECK_THAT(c.notes[0], Catch::Contains("the fp32 products run on onednn"));
  }
  SECTION("the checkpoint's choice wins over the cache and the probe, in either recorded form") {
    KernelChoiceInputs in = fp32_only();
    in.resuming = true;
    in.checkpoint = {
        {"fp32_gemm", {{"forward", "openblas"}, {"backward_input", "onednn"}, {"backward_weight", "onednn"}}}};
    KernelChoice c = decide_kernel_choice(in);
    CHECK(c.fp32_source == "checkpoint");
    CHECK(c.fp32_gemm[LinearProduct::forward] == Fp32Gemm::openblas);
    CHECK(c.fp32_gemm[LinearProduct::backward_weight] == Fp32Gemm::onednn);
    CHECK(c.fp32_line() ==
          "fp32 products: forward openblas, backward_input onednn, backward_weight onednn (from the checkpoint)");
    // The event's form (what rank 0 sends the other ranks, not a resume) reads the same.
    in.resuming = false;
    in.checkpoint = {{"fp32_gemm",
                      {{"path", "openblas"},
                       {"forward", "openblas"},
                       {"backward_input", "openblas"},
                       {"backward_weight", "openblas"},
                       {"source", "probe"}}}};
    c = decide_kernel_choice(in);
    CHECK((c.fp32_source == "checkpoint" && c.fp32_gemm == Fp32GemmChoice::all(Fp32Gemm::openblas)));
    CHECK(c.notes.empty());
    CHECK(probe.fp32_calls == 0);
  }
  SECTION("a checkpoint written before the choice existed ran oneDNN, and keeps it") {
    std::string w;
    KernelCacheEntry e;
    e.key = key();
    e.fp32_gemm = weight_on_openblas();
    REQUIRE(write_kernel_cache(file, e, w));
    KernelChoiceInputs in = fp32_only();
    in.resuming = true;  // an fp32 run state: no kernel_choices at all
    KernelChoice c = decide_kernel_choice(in);
    CHECK(c.fp32_source == "checkpoint");
    CHECK(c.fp32_gemm == Fp32GemmChoice::all(Fp32Gemm::onednn));
    CHECK_THAT(c.fp32_detail, Catch::Contains("written before the fp32 choice existed"));
    in = inputs(file, probe);  // a bf16 run state: the bf16 path, no fp32_gemm
    in.resuming = true;
    in.checkpoint = {{"bf16_gemm", "widened"}};
    c = decide_kernel_choice(in);
    CHECK((c.fp32_source == "checkpoint" && c.fp32_gemm == Fp32GemmChoice::all(Fp32Gemm::onednn)));
    CHECK((c.source == "checkpoint" && c.bf16_gemm == Bf16Gemm::widened));
    CHECK(probe.fp32_calls == 0);
  }
  SECTION("a malformed record: said, and measured again") {
    KernelChoiceInputs in = fp32_only();
    in.checkpoint = {{"fp32_gemm", {{"forward", "mkl"}}}};
    const KernelChoice c = decide_kernel_choice(in);
    CHECK(c.fp32_source == "probe");
    REQUIRE(c.notes.size() == 1);
    CHECK_THAT(c.notes[0], Catch::Contains("kernel_choices.fp32_gemm is"));
  }
  SECTION("MEGATRAIN_FP32_GEMM wins over everything, and says what it changes") {
    KernelChoiceInputs in = fp32_only();
    in.fp32_forced = Fp32Gemm::onednn;
    in.fp32_process = weight_on_openblas();
    in.resuming = true;
    in.checkpoint = {{"fp32_gemm", "openblas"}};
    const KernelChoice c = decide_kernel_choice(in);
    CHECK(c.fp32_source == "forced");
    CHECK(c.fp32_line() == "fp32 products: onednn (forced by MEGATRAIN_FP32_GEMM)");
    REQUIRE(c.notes.size() == 1);
    CHECK_THAT(c.notes[0], Catch::Contains("the checkpoint's run computed its fp32 products on openblas") &&
                               Catch::Contains("bits differ"));
    CHECK(probe.fp32_calls == 0);
    CHECK_FALSE(fs::exists(file));  // nothing measured, nothing cached
  }
  SECTION("a choice fixed earlier in this process stays") {
    KernelChoiceInputs in = fp32_only();
    in.fp32_process = Fp32GemmChoice::all(Fp32Gemm::onednn);
    const KernelChoice c = decide_kernel_choice(in);
    CHECK((c.fp32_source == "process" && c.fp32_gemm == Fp32GemmChoice::all(Fp32Gemm::onednn)));
    CHECK(c.notes.empty());
    CHECK(probe.fp32_calls == 0);
  }
}

TEST_CASE("kernel choice cache: an entry written before OpenBLAS was in the key never matches",
          "[actors][kernel_choice]") {
  mt::test::TempDir dir("kold");
  const fs::path file = dir.path / "kernel_choices.json";
  write_text(file, "{\"format\": \"megatrain-kernel-choices\", \"format_version\": 1, \"entries\": [{\"cpu\": \"" +
                       key().cpu + "\", \"isa\": \"" + key().isa +
                       "\", \"onednn\": \"2.6.3\", \"threads\": 2, \"shapes\": \"" + key().shapes +
                       "\", \"bf16_gemm\": \"widened\"}]}");
  std::string w;
  KernelCacheKey old = key();
  old.blas = "";
  REQUIRE(read_kernel_cache(file, old, w));  // read, keyed by an empty blas
  CHECK(w.empty());
  CHECK_FALSE(read_kernel_cache(file, key(), w));
}
