// One rank's pipeline stage: its slice of the model, the schedule's forwards and backwards,
// and the messages between neighbours.
//
// Protocol between stage s and s + 1, per micro-batch m, in schedule order:
//   s -> s+1  header (tag base+0): 8 i64 {m, dtype, ndim, dims...} of the activation
//   s -> s+1  activation (tag base+1): the stage's output, contiguous
//   s+1 -> s  gradient (tag base+2): d loss / d activation, same shape and dtype
// Messages of one tag between two ranks arrive in the order they were sent, and both sides
// walk micro-batches in the same order for each direction (forwards ascending, backwards
// ascending), so no message needs matching by micro-batch; the header's m is checked anyway.
// Sends are non-blocking and complete while the stage waits for its next receive (the
// engine progresses every queued transfer in any wait), so neighbours that send to each
// other at the same moment (1F1B's steady state) cannot block each other.
#include <algorithm>
#include <chrono>
#include <set>

#include "kolo/autograd.h"
#include "kolo/error.h"
#include "kolo/memory.h"
#include "kolo/ops.h"
#include "kolo/parallel/pipeline.h"

namespace kolo::parallel {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kHeaderWords = 8;
constexpr int kMaxDims = kHeaderWords - 3;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool differentiable(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::F16 || dtype == DType::BF16;
}

// Holds a module's buffers as they are and puts them back when it goes: the forward that
// recomputation runs again for the backward must not move batch norm's running statistics a
// second time for the same micro-batch.
class KeepBuffers {
 public:
  explicit KeepBuffers(nn::Module& module) : buffers_(module.namedBuffers()) {
    for (const auto& [name, buffer] : buffers_) saved_.push_back(buffer.clone());
  }
  ~KeepBuffers() {
    for (size_t i = 0; i < saved_.size(); ++i) buffers_[i].second.copyFrom(saved_[i]);
  }
  KeepBuffers(const KeepBuffers&) = delete;
  KeepBuffers& operator=(const KeepBuffers&) = delete;

 private:
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<Tensor> saved_;
};

}  // namespace

StageModule::StageModule(const nn::Sequential& model, int begin, int end)
    : begin_(begin), end_(end), recompute_(model.recompute()) {
  KOLO_REQUIRE(begin >= 0 && begin < end && end <= static_cast<int>(model.size()), "pipeline stage: layers [",
               begin, ", ", end, ") do not fit a model of ", model.size(), " layers");
  for (int i = begin; i < end; ++i) {
    const auto& [name, layer] = model.children()[static_cast<size_t>(i)];
    registerModule(name, layer);
  }
}

StageModule::StageModule(std::shared_ptr<nn::Module> whole) : begin_(0), end_(1), whole_(std::move(whole)) {
  KOLO_REQUIRE(whole_ != nullptr, "pipeline stage: the model is null");
  // The root's own tensors under their names, then its children: stateDict()'s order.
  std::set<const TensorImpl*> buffers;
  for (const auto& [name, t] : whole_->namedBuffers()) buffers.insert(t.impl());
  for (const auto& [name, t] : whole_->stateDict()) {
    if (name.find('.') != std::string::npos) continue;
    if (buffers.count(t.impl()))
      registerBuffer(name, t);
    else
      registerParameter(name, t);
  }
  for (const auto& [name, child] : whole_->children()) registerModule(name, child);
}

Tensor StageModule::forward(const Tensor& x) {
  if (whole_) return (*whole_)(x);
  Tensor h = x;
  for (const auto& child : children()) h = recompute_ ? nn::checkpoint(*child.second, h) : (*child.second)(h);
  return h;
}

// What the stage keeps of a micro-batch between its forward and its backward.
struct PipelineStage::InFlight {
  Tensor input;   // the received activation (a leaf requiring grad), or the first stage's rows
  Tensor output;  // the stage's output with its graph (not kept under recompute)
  Tensor loss;    // last stage: the micro-batch's loss / M, with its graph (not under recompute)
  Tensor labels;  // last stage
};

struct PipelineStage::PendingSend {
  Tensor data;  // keeps the bytes alive until the send completes
  std::vector<int64_t> header;
  std::unique_ptr<comm::Work> work;
};

PipelineStage::PipelineStage(std::shared_ptr<comm::Communicator> comm, const nn::Sequential& model,
                             std::vector<int> splits, PipelineOptions options, StageLossFn loss,
                             const StageOptimizerFactory& optimizerFactory)
    : comm_(std::move(comm)), options_(options), loss_(std::move(loss)) {
  stages_ = comm_ ? comm_->size() : 1;
  stage_ = comm_ ? comm_->rank() : 0;
  const int n = static_cast<int>(model.size());
  KOLO_REQUIRE(options_.microBatches >= 1, "pipeline: micro-batches must be at least 1, got ",
               options_.microBatches);
  KOLO_REQUIRE(static_cast<int>(splits.size()) == stages_ - 1, "pipeline: ", splits.size(),
               " split points for ", stages_, " stages (one rank per stage) need ", stages_ - 1);
  bounds_.push_back(0);
  for (int s : splits) {
    KOLO_REQUIRE(s > bounds_.back() && s < n, "pipeline: split point ", s, " is not inside (",
                 bounds_.back(), ", ", n, "); the model has ", n, " layers and each stage needs one");
    bounds_.push_back(s);
  }
  bounds_.push_back(n);
  KOLO_REQUIRE(loss_ != nullptr, "pipeline: the last stage needs a loss function");
  module_ = std::make_shared<StageModule>(model, bounds_[static_cast<size_t>(stage_)],
                                          bounds_[static_cast<size_t>(stage_) + 1]);
  optimizer_ = optimizerFactory(module_->namedParameters());
}

PipelineStage::PipelineStage(std::shared_ptr<comm::Communicator> comm, std::shared_ptr<nn::Module> model,
                             PipelineOptions options, StageLossFn loss, const StageOptimizerFactory& optimizerFactory)
    : comm_(std::move(comm)), options_(options), loss_(std::move(loss)) {
  KOLO_REQUIRE(!comm_ || comm_->size() == 1, "pipeline: ", comm_ ? comm_->size() : 1,
               " stages cut an nn::Sequential into its layers; this model is one stage");
  KOLO_REQUIRE(options_.microBatches >= 1, "pipeline: micro-batches must be at least 1, got ",
               options_.microBatches);
  KOLO_REQUIRE(loss_ != nullptr, "pipeline: the last stage needs a loss function");
  bounds_ = {0, 1};
  module_ = std::make_shared<StageModule>(std::move(model));
  optimizer_ = optimizerFactory(module_->namedParameters());
}

PipelineStage::~PipelineStage() {
  // Sends still queued (a step that failed) must not outlive their buffers.
  for (auto& send : sends_) {
    try {
      if (send->work && !send->work->test()) send->work->wait(std::chrono::milliseconds(1000));
    } catch (const std::exception&) {
    }
  }
}

void PipelineStage::sendTensor(const Tensor& t, int peer, int tag) {
  auto send = std::make_unique<PendingSend>();
  send->data = t.contiguous();
  send->work = comm_->isend(send->data.rawData(), static_cast<size_t>(send->data.numel()), send->data.dtype(),
                            peer, tag);
  sends_.push_back(std::move(send));
  // Drop completed sends from the front so their buffers go back early.
  while (!sends_.empty() && sends_.front()->work->test()) sends_.erase(sends_.begin());
}

void PipelineStage::sendActivation(int microBatch, const Tensor& output) {
  KOLO_REQUIRE(output.dim() <= kMaxDims, "pipeline stage ", stage_, ": output ", shapeString(output.shape()),
               " has more than ", kMaxDims, " dimensions, more than a stage can send");
  auto header = std::make_unique<PendingSend>();
  header->header.assign(kHeaderWords, 0);
  header->header[0] = microBatch;
  header->header[1] = static_cast<int64_t>(output.dtype());
  header->header[2] = output.dim();
  for (int64_t d = 0; d < output.dim(); ++d)
    header->header[static_cast<size_t>(3 + d)] = output.shape()[static_cast<size_t>(d)];
  header->work = comm_->isend(header->header.data(), header->header.size(), DType::I64, stage_ + 1,
                              options_.tagBase);
  sends_.push_back(std::move(header));
  sendTensor(output, stage_ + 1, options_.tagBase + 1);
}

void PipelineStage::waitSends() {
  for (auto& send : sends_) send->work->wait();
  sends_.clear();
}

Tensor PipelineStage::receiveActivation(int microBatch) {
  const int from = stage_ - 1;
  std::vector<int64_t> header(kHeaderWords, 0);
  comm_->recv(header.data(), header.size(), DType::I64, from, options_.tagBase);
  const int64_t ndim = header[2];
  KOLO_REQUIRE(header[0] == microBatch && ndim >= 0 && ndim <= kMaxDims && header[1] >= 0 &&
                   header[1] <= static_cast<int64_t>(DType::U8),
               "pipeline stage ", stage_, ": bad activation header from stage ", from, " (micro-batch ",
               header[0], " where ", microBatch, " was due, ", ndim, " dimensions)");
  Shape shape(header.begin() + 3, header.begin() + 3 + ndim);
  for (int64_t d : shape)
    KOLO_REQUIRE(d >= 0 && d <= (int64_t{1} << 40), "pipeline stage ", stage_, ": activation dimension ", d,
                 " from stage ", from);
  Tensor t = Tensor::empty(shape, static_cast<DType>(header[1]));
  comm_->recv(t.rawData(), static_cast<size_t>(t.numel()), t.dtype(), from, options_.tagBase + 1);
  return t;
}

size_t PipelineStage::heldBytes() const {
  size_t bytes = 0;
  for (const auto& f : inFlight_) {
    if (!f) continue;
    if (f->input.defined()) bytes += f->input.nbytes();
    if (f->output.defined()) bytes += f->output.nbytes();
  }
  return bytes;
}

void PipelineStage::runForward(int m, const Tensor& inputs, const Tensor& labels, PipelineStepStats& stats) {
  auto flight = std::make_unique<InFlight>();
  if (isFirst()) {
    flight->input = inputs.slice(0, m * microRows_, (m + 1) * microRows_).contiguous();
  } else {
    flight->input = receiveActivation(m);
    if (differentiable(flight->input.dtype())) flight->input.setRequiresGrad(true);
  }
  if (isLast()) flight->labels = labels.slice(0, m * microRows_, (m + 1) * microRows_).contiguous();
  const auto start = Clock::now();
  const double scale = 1.0 / options_.microBatches;
  Tensor output;
  if (options_.recompute) {
    autograd::NoGradGuard noGrad;
    output = module_->forward(flight->input);
    if (isLast()) lossSum_ += loss_(output, flight->labels).item();
  } else {
    output = module_->forward(flight->input);
    if (isLast()) {
      // Each micro-batch's mean loss weighs 1/M, so the accumulated gradient is the mean
      // over the whole batch.
      Tensor loss = loss_(output, flight->labels);
      lossSum_ += loss.item();
      flight->loss = loss * scale;
    }
    flight->output = output;
  }
  stats.computeSeconds += secondsSince(start);
  if (!isLast()) {
    sendActivation(m, output.detach());
    if (options_.recompute) flight->output = Tensor();  // the send holds the bytes until it completes
  }
  inFlight_[static_cast<size_t>(m)] = std::move(flight);
  ++held_;
  stats.peakMicroBatchesHeld = std::max(stats.peakMicroBatchesHeld, held_);
  stats.peakBoundaryBytes = std::max(stats.peakBoundaryBytes, heldBytes());
}

void PipelineStage::runBackward(int m, PipelineStepStats& stats) {
  std::unique_ptr<InFlight> flight = std::move(inFlight_[static_cast<size_t>(m)]);
  KOLO_CHECK(flight != nullptr, "pipeline stage ", stage_, ": backward of micro-batch ", m, " before its forward");
  Tensor gradOutput;
  if (!isLast()) {
    // (shape of this stage's output) from the next stage; under recompute the shape is only
    // known after the forward runs again, so that runs first.
    if (options_.recompute) {
      const auto start = Clock::now();
      KeepBuffers keep(*module_);
      flight->output = module_->forward(flight->input);
      stats.computeSeconds += secondsSince(start);
    }
    gradOutput = Tensor::empty(flight->output.shape(), flight->output.dtype());
    comm_->recv(gradOutput.rawData(), static_cast<size_t>(gradOutput.numel()), gradOutput.dtype(), stage_ + 1,
                options_.tagBase + 2);
  }
  const auto start = Clock::now();
  if (isLast()) {
    if (options_.recompute) {
      KeepBuffers keep(*module_);
      flight->output = module_->forward(flight->input);
      flight->loss = loss_(flight->output, flight->labels) * (1.0 / options_.microBatches);
    }
    flight->loss.backward();
  } else if (flight->output.requiresGrad()) {
    flight->output.backward(gradOutput);
  }
  stats.computeSeconds += secondsSince(start);
  if (!isFirst() && flight->input.requiresGrad()) {
    Tensor grad = flight->input.grad();
    if (!grad.defined()) grad = Tensor::zeros(flight->input.shape(), flight->input.dtype());
    sendTensor(grad, stage_ - 1, options_.tagBase + 2);
  }
  --held_;
}

PipelineStepStats PipelineStage::forwardBackward(const Tensor& inputs, const Tensor& labels, bool shareLoss) {
  const auto start = Clock::now();
  PipelineStepStats stats;
  const int64_t baseBytes = liveTensorBytes();
  resetPeakTensorBytes();
  const int micro = options_.microBatches;
  const Tensor& rows = isFirst() ? inputs : labels;
  if (isFirst() || isLast()) {
    KOLO_REQUIRE(rows.defined() && rows.dim() >= 1, "pipeline stage ", stage_, ": the ",
                 isFirst() ? "inputs" : "labels", " of the batch are missing");
    const int64_t batch = rows.shape()[0];
    KOLO_REQUIRE(batch % micro == 0 && batch >= micro, "pipeline: a batch of ", batch,
                 " rows cannot be split into ", micro, " equal micro-batches (the batch must be a "
                 "multiple of PipelineOptions::microBatches)");
    microRows_ = batch / micro;
    if (isFirst() && isLast())
      KOLO_REQUIRE(labels.defined() && labels.shape()[0] == batch, "pipeline: inputs have ", batch,
                   " rows but labels ", labels.defined() ? labels.shape()[0] : 0);
  }
  inFlight_.clear();
  inFlight_.resize(static_cast<size_t>(micro));
  held_ = 0;
  lossSum_ = 0.0;
  try {
    for (const PipelineAction& action : pipelineActions(options_.schedule, stages_, stage_, micro)) {
      if (action.forward) {
        runForward(action.microBatch, inputs, labels, stats);
      } else {
        runBackward(action.microBatch, stats);
      }
    }
    if (comm_) waitSends();
  } catch (...) {
    inFlight_.clear();
    throw;
  }
  inFlight_.clear();
  stats.peakStepBytes = peakTensorBytes() - baseBytes;
  stats.loss = lossSum_ / micro;
  if (shareLoss && stages_ > 1) comm_->broadcast(&stats.loss, 1, DType::F64, stages_ - 1);
  stats.stepSeconds = secondsSince(start);
  return stats;
}

void PipelineStage::forwardOnly(int64_t chunks, const std::function<Tensor(int64_t chunk)>& input,
                                const std::function<void(int64_t chunk, const Tensor& output)>& onOutput) {
  autograd::NoGradGuard noGrad;
  try {
    for (int64_t c = 0; c < chunks; ++c) {
      // The header's micro-batch word counts chunks here (an int, as in training).
      const int tag = static_cast<int>(c % (int64_t{1} << 30));
      const Tensor x = isFirst() ? input(c) : receiveActivation(tag);
      const Tensor output = module_->forward(x);
      if (isLast()) {
        onOutput(c, output);
      } else {
        sendActivation(tag, output.contiguous());
      }
    }
    if (comm_) waitSends();
  } catch (...) {
    sends_.clear();
    throw;
  }
}

PipelineStepStats PipelineStage::trainStep(const Tensor& inputs, const Tensor& labels, bool shareLoss) {
  const auto start = Clock::now();
  optimizer_->zeroGrad();
  PipelineStepStats stats = forwardBackward(inputs, labels, shareLoss);
  const auto update = Clock::now();
  optimizer_->step();
  stats.computeSeconds += secondsSince(update);
  stats.stepSeconds = secondsSince(start);
  return stats;
}

void PipelineStage::gatherModel(nn::Module* whole, int root) {
  // Every entry of the whole model's state dict (parameters and buffers) belongs to the stage
  // holding its layer: the child named by the name's first component ("3" of an unnamed
  // Sequential, "layer2" of the resnet); owners send theirs in state-dict order, which is the
  // whole model's order restricted to the stage.
  auto ownerOf = [this, whole](const std::string& name) {
    const std::string child = name.substr(0, name.find('.'));
    const auto& children = whole->children();
    const auto found = std::find_if(children.begin(), children.end(),
                                    [&](const auto& entry) { return entry.first == child; });
    KOLO_CHECK(found != children.end(), "pipeline: ", name, " belongs to no layer of the whole model");
    const int layer = static_cast<int>(found - children.begin());
    int s = 0;
    while (layer >= bounds_[static_cast<size_t>(s) + 1]) ++s;
    return s;
  };
  constexpr int kGatherTag = 7190;
  if (stage_ == root) {
    KOLO_REQUIRE(whole != nullptr, "pipeline: gatherModel needs the whole model on rank ", root);
    const auto local = module_->stateDict();
    size_t next = 0;
    for (auto& [name, tensor] : whole->stateDict()) {
      const int owner = ownerOf(name);
      if (owner == stage_) {
        KOLO_CHECK(next < local.size() && local[next].first == name, "pipeline: stage ", stage_,
                   " has no entry ", name);
        tensor.copyFrom(local[next++].second);
      } else {
        KOLO_CHECK(tensor.isContiguous(), "pipeline: ", name, " is not contiguous");
        comm_->recv(tensor.rawData(), static_cast<size_t>(tensor.numel()), tensor.dtype(), owner, kGatherTag);
      }
    }
  } else {
    for (const auto& [name, tensor] : module_->stateDict()) {
      const Tensor data = tensor.contiguous();
      comm_->send(data.rawData(), static_cast<size_t>(data.numel()), data.dtype(), root, kGatherTag);
    }
  }
}

}  // namespace kolo::parallel
