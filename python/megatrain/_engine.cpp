// megatrain._engine: the C++ engine for Python (pybind11). Thin on purpose: a run is configured with
// the binary's `--section.key=value` arguments and validated by the engine's own code; weights cross
// one tensor at a time (Hugging Face names, file orientation) so no second full copy of a model is
// made; data reaches the engine as llm.c token shards written with data/'s ShardWriter.
//
// train() runs node/training_run.hpp on a worker thread while the calling (main) thread, with the GIL
// released between polls, hands progress to Python and checks for signals: Ctrl-C sets the engine's
// stop flag (the step in progress finishes, the final checkpoint is written) instead of unwinding.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/shard.hpp"
#include "data/tokenizer.hpp"
#include "kernels/param_layout.hpp"
#include "node/training_run.hpp"
#include "storage/hf/hf_config.hpp"
#include "storage/hf/hf_model.hpp"

namespace py = pybind11;

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

mt::ModelConfig parse_model_config(const std::string& config_json) {
  return mt::hf::parse_config(nlohmann::json::parse(config_json), "model.config");
}

// Copies one tensor in file orientation ([in, out] for GPT-2's Conv1D) into the stage buffer.
void tensor_into_stage(const mt::hf::HfTensorName& hn, const mt::TensorSpec& t, const float* src, float* stage) {
  float* dst = stage + t.offset;
  if (!hn.transposed) {
    std::memcpy(dst, src, t.numel * sizeof(float));
    return;
  }
  const std::int64_t rows = hn.file_shape[0], cols = hn.file_shape[1];  // dst is [cols, rows]
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

void tensor_from_stage(const mt::hf::HfTensorName& hn, const mt::TensorSpec& t, const float* stage, float* out) {
  const float* src = stage + t.offset;
  if (!hn.transposed) {
    std::memcpy(out, src, t.numel * sizeof(float));
    return;
  }
  const std::int64_t rows = hn.file_shape[0], cols = hn.file_shape[1];
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[r * cols + c] = src[c * rows + r];
}

// Fills one stage buffer (stage_layout(model, s).total_floats floats, padding zero) from
// source(name) -> float32 array of the tensor's file shape. Needs the GIL.
void fill_stage(const mt::ModelConfig& model, std::int64_t s, const py::function& source, float* stage) {
  const mt::ParamLayout layout = mt::stage_layout(model, s);
  std::memset(stage, 0, layout.total_floats * sizeof(float));
  for (const auto& t : layout.tensors) {
    const mt::hf::HfTensorName hn = mt::hf::hf_tensor(model, layout, t);
    auto array = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(source(hn.name));
    if (!array) throw std::runtime_error("model tensor " + hn.name + ": not convertible to float32");
    std::vector<std::int64_t> shape(array.shape(), array.shape() + array.ndim());
    if (shape != hn.file_shape)
      throw std::runtime_error("model tensor " + hn.name + " has shape " + shape_text(shape) +
                               ", the model's config asks for " + shape_text(hn.file_shape));
    tensor_into_stage(hn, t, array.data(), stage);
  }
}

// Hands every tensor of a stage to sink(name, float32 array in file shape). Needs the GIL.
void drain_stage(const mt::ModelConfig& model, std::int64_t s, const py::function& sink, const float* stage) {
  const mt::ParamLayout layout = mt::stage_layout(model, s);
  for (const auto& t : layout.tensors) {
    const mt::hf::HfTensorName hn = mt::hf::hf_tensor(model, layout, t);
    py::array_t<float> out(hn.file_shape);
    tensor_from_stage(hn, t, stage, out.mutable_data());
    sink(hn.name, out);
  }
}

// Runs a Python call from an engine thread: takes the GIL, and turns a Python exception into a C++ one
// while the GIL is still held (error_already_set must not outlive it).
template <typename F>
void with_gil(F&& f) {
  py::gil_scoped_acquire gil;
  try {
    f();
  } catch (py::error_already_set& e) {
    throw std::runtime_error(e.what());
  }
}

py::dict step_dict(const mt::actors::StepRecord& r) {
  py::dict d;
  d["step"] = r.step;
  d["loss"] = r.loss;
  d["lr"] = r.lr;
  d["grad_norm"] = r.grad_norm;
  d["clip"] = r.clip;
  d["tokens"] = r.tokens;
  d["tokens_per_s"] = r.tokens_per_s;
  d["step_s"] = r.step_s;
  d["restarts"] = r.restarts;
  return d;
}

// What the engine threads report, handed to Python by the calling thread.
struct Mailbox {
  struct Item {
    bool is_step = false;
    mt::actors::StepRecord step;
    bool is_error = false;
    std::string line;
  };
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Item> items;
  bool done = false;

  void post(Item item) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      items.push_back(std::move(item));
    }
    wake.notify_one();
  }
};

// train(args, model_config_json, weight_source, weight_sink, on_message, on_step) -> dict.
// weight_source(name) -> array (None: the engine's own starting weights); weight_sink(name, array)
// receives the final weights (None: not wanted). on_message(is_error, line), on_step(dict).
py::dict train(const std::vector<std::string>& args, const std::string& model_config_json, py::object weight_source,
               py::object weight_sink, py::function on_message, py::function on_step) {
  mt::TrainConfig cfg;
  const std::string error = mt::node::parse_train_config(args, cfg);
  if (!error.empty()) throw std::invalid_argument(error);

  Mailbox mailbox;
  std::atomic<bool> stop{false};
  mt::node::TrainingHooks hooks;
  hooks.stop = &stop;
  hooks.message = [&](mt::node::MessageStream s, const std::string& line) {
    Mailbox::Item item;
    item.is_error = s == mt::node::MessageStream::err;
    item.line = line;
    mailbox.post(std::move(item));
  };
  hooks.on_step = [&](const mt::actors::StepRecord& r) {
    Mailbox::Item item;
    item.is_step = true;
    item.step = r;
    mailbox.post(std::move(item));
  };
  // Held here (not in the branches): the hooks keep references to them.
  const py::function source = weight_source.is_none() ? py::function() : py::function(weight_source);
  const py::function sink = weight_sink.is_none() ? py::function() : py::function(weight_sink);
  if (source) {
    hooks.initial_weights = [&](mt::HostModel& host) {
      for (std::int64_t s = 0; s < host.num_stages(); ++s) {
        host.set_masters(s, [&](float* masters) { with_gil([&] { fill_stage(host.config(), s, source, masters); }); });
      }
      return model_config_json;
    };
  }
  if (sink) {
    hooks.on_finished = [&](const mt::HostModel& host, const std::string&) {
      for (std::int64_t s = 0; s < host.num_stages(); ++s)
        host.read_masters(
            s, [&](const float* masters) { with_gil([&] { drain_stage(host.config(), s, sink, masters); }); });
    };
  }

  mt::node::TrainingResult result;
  bool interrupted = false;
  std::unique_ptr<py::error_already_set> callback_error;
  {
    py::gil_scoped_release released;
    std::thread worker([&] {
      try {
        result = mt::node::run_training(cfg, hooks);
      } catch (const std::exception& e) {  // run_training reports bad input itself; this is e.g. bad_alloc
        result.exit_status = 1;
        result.error = e.what();
      }
      std::lock_guard<std::mutex> lock(mailbox.mutex);
      mailbox.done = true;
      mailbox.wake.notify_one();
    });
    for (bool finished = false; !finished;) {
      std::deque<Mailbox::Item> items;
      {
        std::unique_lock<std::mutex> lock(mailbox.mutex);
        mailbox.wake.wait_for(lock, std::chrono::milliseconds(100),
                              [&] { return mailbox.done || !mailbox.items.empty(); });
        items.swap(mailbox.items);
        finished = mailbox.done && items.empty();
      }
      py::gil_scoped_acquire gil;
      for (const auto& item : items) {
        if (callback_error) break;  // the run is stopping; nothing more is handed to Python
        try {
          if (item.is_step)
            on_step(step_dict(item.step));
          else
            on_message(item.is_error, item.line);
        } catch (py::error_already_set& e) {
          if (e.matches(PyExc_KeyboardInterrupt))  // Ctrl-C while Python ran a callback
            interrupted = true;
          else
            callback_error = std::make_unique<py::error_already_set>(std::move(e));
          stop.store(true);
        }
      }
      if (PyErr_CheckSignals() != 0) {  // Ctrl-C (KeyboardInterrupt) or an exception from a handler
        py::error_already_set e;
        if (e.matches(PyExc_KeyboardInterrupt)) {
          interrupted = true;
        } else if (!callback_error) {
          callback_error = std::make_unique<py::error_already_set>(std::move(e));
        }
        stop.store(true);
      }
    }
    worker.join();
  }
  if (callback_error) throw std::move(*callback_error);

  py::dict out;
  out["exit_status"] = result.exit_status;
  out["error"] = result.error;
  out["first_step"] = result.first_step;
  out["steps_done"] = result.engine.steps_done;
  out["stopped_early"] = result.engine.stopped_early;
  out["interrupted"] = interrupted;
  out["wall_s"] = result.engine.wall_s;
  out["tokens_per_step"] = result.tokens_per_step;
  out["train_jsonl"] = result.train_jsonl;
  py::list steps;
  for (const auto& r : result.engine.steps) steps.append(step_dict(r));
  out["steps"] = steps;
  py::list checkpoints;
  for (const auto& c : result.engine.checkpoints)
    if (c.ok) checkpoints.append(c.path);
  out["checkpoints"] = checkpoints;
  return out;
}

// The engine's Hugging Face export (storage/hf's write_hf_model), one stage at a time from source.
void export_hf(const std::string& dir, const std::string& model_config_json, py::function source) {
  const mt::ModelConfig model = parse_model_config(model_config_json);
  const nlohmann::json base = nlohmann::json::parse(model_config_json);
  mt::hf::HfExportOptions options;
  options.base_config = &base;
  std::vector<float> stage;
  mt::hf::write_hf_model(
      dir, model,
      [&](std::int64_t s) {
        stage.assign(mt::stage_layout(model, s).total_floats, 0.0f);
        fill_stage(model, s, source, stage.data());
        return stage.data();
      },
      options);
}

py::dict model_summary(const std::string& model_config_json) {
  const mt::ModelConfig m = parse_model_config(model_config_json);
  py::dict d;
  d["arch"] = mt::arch_name(m.arch);
  d["vocab_size"] = m.vocab_size;
  d["max_position_embeddings"] = m.max_position_embeddings;
  d["num_hidden_layers"] = m.num_hidden_layers;
  d["parameters"] = mt::total_param_count(m);
  return d;
}

}  // namespace

PYBIND11_MODULE(_engine, m) {
  m.doc() = "megatrain's C++ engine (see megatrain/__init__.py for the Python API)";
  // pybind11 before 2.12 reads NumPy 1's array descriptors; with NumPy 2 its arrays come out wrong.
  m.attr("numpy2_supported") = PYBIND11_VERSION_MAJOR > 2 || PYBIND11_VERSION_MINOR >= 12;
  m.attr("pybind11_version") = std::to_string(PYBIND11_VERSION_MAJOR) + "." + std::to_string(PYBIND11_VERSION_MINOR);
  py::register_exception<mt::ConfigError>(m, "EngineConfigError", PyExc_ValueError);
  py::register_exception<mt::hf::HfError>(m, "ModelError", PyExc_ValueError);
  py::register_exception<mt::data::DataError>(m, "DataError", PyExc_ValueError);

  m.def("config_keys", &mt::node::train_config_keys, "every engine key, 'section.key'");
  m.def(
      "check_config",
      [](const std::vector<std::string>& args, bool check_files) {
        mt::TrainConfig cfg;
        return mt::node::parse_train_config(args, cfg, check_files);
      },
      py::arg("args"), py::arg("check_files") = true,
      "validates --section.key=value arguments as `megatrain train` does: '' or the error");
  m.def("model_summary", &model_summary, "parses a config.json text as the engine does (ValueError naming the field)");
  m.def("train", &train, py::arg("args"), py::arg("model_config_json"), py::arg("weight_source"),
        py::arg("weight_sink"), py::arg("on_message"), py::arg("on_step"));
  m.def("export_hf", &export_hf, py::arg("dir"), py::arg("model_config_json"), py::arg("weight_source"));

  py::class_<mt::data::Tokenizer>(m, "Tokenizer")
      .def_static("load", &mt::data::Tokenizer::load, "a tokenizer.json, or a directory holding one (or GPT-2's files)")
      .def_static("from_json_text", &mt::data::Tokenizer::from_hf_json_text, py::arg("json_text"),
                  py::arg("name") = "tokenizer.json")
      .def(
          "encode",
          [](const mt::data::Tokenizer& t, const std::string& text) {
            const std::vector<uint32_t> ids = t.encode(text);
            return py::array_t<uint32_t>(static_cast<py::ssize_t>(ids.size()), ids.data());
          },
          py::arg("text"))
      .def(
          "token_lengths",  // bytes of each token (the chat front door locates assistant turns by offset)
          [](const mt::data::Tokenizer& t, py::array_t<uint32_t, py::array::c_style | py::array::forcecast> ids) {
            py::array_t<int64_t> out(ids.size());
            for (py::ssize_t i = 0; i < ids.size(); ++i)
              out.mutable_data()[i] = static_cast<int64_t>(t.id_to_bytes(ids.data()[i]).size());
            return out;
          },
          py::arg("ids"))
      .def("vocab_size", &mt::data::Tokenizer::vocab_size)
      .def("eot_id", &mt::data::Tokenizer::eot_id);

  py::class_<mt::data::ShardWriter>(m, "ShardWriter")
      .def(py::init<std::string, int, bool>(), py::arg("path"), py::arg("token_bytes"), py::arg("with_mask") = false)
      .def(
          "append",
          [](mt::data::ShardWriter& w, py::array_t<uint32_t, py::array::c_style | py::array::forcecast> ids,
             std::optional<py::array_t<uint8_t, py::array::c_style | py::array::forcecast>> mask) {
            // mask: one byte per id, 1 = the token is a target (None: every token is)
            if (mask && mask->size() != ids.size())
              throw std::invalid_argument("ShardWriter.append: mask has " + std::to_string(mask->size()) +
                                          " entries, ids " + std::to_string(ids.size()));
            w.begin_document();  // one append = one document (the shard's `.docs`, data.packing = documents)
            w.append(ids.data(), mask ? mask->data() : nullptr, static_cast<std::size_t>(ids.size()));
          },
          py::arg("ids"), py::arg("mask") = py::none())
      .def("commit", &mt::data::ShardWriter::commit)
      .def_property_readonly("tokens", &mt::data::ShardWriter::tokens);
}
