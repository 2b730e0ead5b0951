// Tensor parallelism (Megatron-LM style) by plan: any module tree split in place over the T
// ranks of a communicator, each module named by path in a plan that says how it is split
// (PyTorch's parallelize_module with ColwiseParallel / RowwiseParallel / SequenceParallel).
// A column-wise Linear holds a block of the output features (identity forward, all-reduce of
// the input gradient backward); a row-wise Linear holds a block of the input features
// (all-reduce of the output forward, identity backward); a vocabulary-parallel embedding
// holds V/T rows of its table and a vocabulary-parallel head V/T classes, whose logits the
// cross-entropy takes split; attention splits by heads. With sequence parallelism the norms
// and the residual stream between the split layers hold seq/T of the tokens on each rank: an
// all-gather of the tokens replaces the identity before each column-wise Linear, a
// reduce-scatter the all-reduce after each row-wise one. Everything else is replicated: its
// inputs and output gradients are the same on every rank, so its gradients are too.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/nn/layers.h"

namespace kolo::parallel {

/// Identity forward; the gradient is all-reduced (summed) over `comm` backward. Marks the
/// entry of a tensor-parallel region whose ranks each use x for a part of the output.
Tensor copyToTensorParallel(const Tensor& x, std::shared_ptr<comm::Communicator> comm);
/// All-reduce (sum) forward; identity backward. Marks the exit of a region whose ranks each
/// hold a partial sum of the output.
Tensor reduceFromTensorParallel(const Tensor& x, std::shared_ptr<comm::Communicator> comm);
/// All-gather of the last dimension forward (each rank's x (..., n) holds features
/// rank·n ... rank·n + n − 1; the result (..., T·n) all of them, in order); backward keeps
/// this rank's features of the gradient. A column-wise Linear's gathered output.
Tensor gatherFeatures(const Tensor& x, std::shared_ptr<comm::Communicator> comm);

/// All-gather of the tokens forward, reduce-scatter (sum) of the gradient backward: each
/// rank's x (B, t, ...) holds tokens rank·t ... rank·t + t − 1; the result (B, T·t, ...) all
/// of them, in order. Enters a column-parallel layer from a sequence-parallel region.
Tensor gatherSequence(const Tensor& x, std::shared_ptr<comm::Communicator> comm);
/// Reduce-scatter (sum) of the tokens forward, all-gather of the gradient backward: x (B, S,
/// ...) holds partial sums on every rank; the result (B, S/T, ...) rank r's tokens of the sum.
/// Leaves a row-parallel layer into a sequence-parallel region. Throws InvalidArgument when
/// T does not divide S.
Tensor scatterSequence(const Tensor& x, std::shared_ptr<comm::Communicator> comm);
/// This rank's tokens of x (B, S, ...), the same on every rank: (B, S/T, ...) forward; the
/// gradient all-gathered backward. Enters a sequence-parallel region from a replicated one.
/// Throws InvalidArgument when T does not divide S.
Tensor splitSequence(const Tensor& x, std::shared_ptr<comm::Communicator> comm);

/// The mean cross-entropy of logits split by vocabulary: this rank's logits (..., V/T) are the
/// classes rank·V/T ... (rank+1)·V/T − 1, targets (...) hold whole class ids. The row maxima,
/// the sums of exponentials and the target logits are all-reduced over `comm`, so no rank
/// holds the whole logits; the gradient (softmax − one-hot) stays split. Collective forward
/// (three all-reduces); backward is local. f32 logits; throws InvalidArgument for shapes that
/// do not match.
Tensor vocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets,
                                 std::shared_ptr<comm::Communicator> comm);

/// Rank `rank`'s part of `full` split into `parts` along `dim`, where the dimension is made of
/// `blocks` equal blocks split separately (qkv's q, k and v blocks: blocks = 3): the part
/// concatenates, for every block, its rank-th slice. Throws InvalidArgument when the sizes
/// do not divide.
Tensor shardTensor(const Tensor& full, int dim, int blocks, int rank, int parts);

/// How one parameter of a tensor-parallel model relates to the whole model's: split along
/// `dim` in `blocks` blocks (see shardTensor), or replicated (dim < 0).
struct ShardSpec {
  int dim = -1;
  int blocks = 1;
};

/// The inverse of shardTensor: the whole tensor from every rank's part, in rank order.
Tensor unshardTensor(const std::vector<Tensor>& parts, int dim, int blocks);

/// How a plan splits one module (see TensorParallelPlan). Made by the functions below.
struct ParallelStyle {
  enum class Kind {
    /// A Linear-like module (a 2-d "weight" [out, in], optional "bias" [out]): each rank holds
    /// out/T of the output features, in `blocks` equal blocks split separately (a fused qkv:
    /// 3). Its input's gradient is all-reduced (the tokens all-gathered under sequence
    /// parallelism); its output stays split unless gatherOutput.
    ColumnWise,
    /// A Linear-like module: each rank holds in/T of the input features (its input is a
    /// column-wise layer's split output) and the partial outputs are summed (all-reduced, or
    /// reduce-scattered to each rank's tokens under sequence parallelism); the bias counts once.
    RowWise,
    /// An embedding table (a 2-d "weight" [V, C], looked up by ids), or a module whose child
    /// "tok" is one (nn::TokenPositionEmbedding): each rank holds V/T rows, looks up the ids
    /// in its range and the ranks' rows are summed. Under sequence parallelism its output
    /// holds each rank's tokens.
    VocabularyEmbedding,
    /// The output head, a Linear-like module [V, C]: column-wise by vocabulary, its logits
    /// left split; TensorParallelModel::loss is then the vocabulary-parallel cross-entropy
    /// (no rank holds the whole logits). It must be the last module the model calls.
    VocabularyHead,
    /// A norm (LayerNorm, RMSNorm, a user's own) in the residual stream: replicated; under
    /// sequence parallelism it normalises this rank's tokens and its parameters' gradients
    /// are summed over the ranks (TensorParallelModel::synchronizeGradients).
    SequenceNorm,
    /// Kept whole on every rank; matching it keeps the module out of wider patterns' reach.
    Replicated,
    /// kolo's attention split by heads: nn::CausalSelfAttention's fused "qkv" column-wise in
    /// 3 blocks (q, k and v each split by heads) and "proj" row-wise; nn::GroupedQueryAttention's
    /// "q", "k" and "v" column-wise and "o" row-wise, query and key/value heads split
    /// separately (T must divide both counts). Each rank computes heads/T of the heads.
    AttentionHeads,
  };
  Kind kind = Kind::Replicated;
  /// ColumnWise: all-gather the output features, so that what follows sees the whole output.
  bool gatherOutput = false;
  /// ColumnWise: equal blocks of the output features split separately (fused projections).
  int blocks = 1;
  /// ColumnWise (output features) and RowWise (input features): the split features come in
  /// units never cut apart, an attention head's features (a user's q, k, v and output
  /// projections: the head size), so T must divide the number of units.
  int64_t unit = 1;
};

/// Output features split; `gatherOutput` all-gathers them after the layer, `blocks` > 1 for a
/// fused projection of equal blocks (with gatherOutput false).
ParallelStyle columnWise(bool gatherOutput = false, int blocks = 1);
/// Input features split, the partial sums reduced.
ParallelStyle rowWise();
/// A projection into attention heads of `headDim` features (a user's q, k or v): column-wise,
/// whole heads on each rank.
ParallelStyle columnWiseHeads(int64_t headDim);
/// The projection out of attention heads of `headDim` features (a user's o): row-wise, whole
/// heads on each rank.
ParallelStyle rowWiseHeads(int64_t headDim);
/// Embedding rows split by vocabulary.
ParallelStyle vocabularyEmbedding();
/// Output classes split by vocabulary; the loss never gathers the logits.
ParallelStyle vocabularyHead();
/// A norm of the residual stream (sequence-parallel when the plan is).
ParallelStyle sequenceNorm();
/// Kept whole.
ParallelStyle replicated();
/// nn::CausalSelfAttention split by heads.
ParallelStyle attentionHeads();
/// The style's name as plans print it ("column-wise", "row-wise", ...).
std::string styleName(const ParallelStyle& style);

/// Which module is split how: entries of a path pattern and a style. A pattern names modules
/// by their path in the tree (namedModules(): "blocks.0.attn.q", "3.mlp.0"); "*" matches any
/// run of characters, dots included ("*.attn.q", "blocks.*.mlp.up"). Each module takes the
/// first entry that matches it; a module inside one already split (an attention's children)
/// is not matched again. Modules no entry matches are replicated.
struct TensorParallelPlan {
  /// What the engine and the start line call it ("default", "llama", "my-plan").
  std::string name = "custom";
  std::vector<std::pair<std::string, ParallelStyle>> styles{};
  /// Sequence parallelism: between the split layers every rank holds seq/T of the tokens (the
  /// sequence length must be a multiple of T). The model must enter the split region through
  /// a vocabularyEmbedding, leave it through a vocabularyHead, and every norm with
  /// parameters in between must be a sequenceNorm.
  bool sequenceParallel = false;
};

/// The plan of kolo's own building blocks found in `model`: nn::TokenPositionEmbedding,
/// nn::TokenEmbedding and an nn::Embedding whose table an nn::LanguageModelHead shares (tied)
/// vocabulary-parallel; nn::TransformerBlock (attention by heads, its mlp column- then
/// row-wise, its norms sequenceNorm); nn::LlamaBlock's norms sequenceNorm;
/// nn::GroupedQueryAttention by heads; nn::SwiGLU's gate and up column-wise and down row-wise;
/// nn::LanguageModelHead vocabulary-parallel; LayerNorms and RMSNorms standing in the root
/// sequenceNorm; and, in any other Sequential, a Linear followed (after only element-wise
/// layers: ReLU, GELU, Tanh, SiLU) by another Linear column- then row-wise. Named "default".
/// Empty when it finds none of them (which TensorParallelModel refuses).
TensorParallelPlan defaultPlan(const nn::Module& model);

/// A module tree split in place by a plan over the tensor group `comm` (T = comm->size()
/// ranks, each holding the same model before: the same seed or the same weights, or a
/// pipeline stage's part with empty placeholders for the rest). Each split parameter keeps
/// its name and becomes this rank's shard of it (shardSpecs()); the split modules get input
/// and output transforms (nn::Module::addInputTransform) that carry the collectives, so the
/// model must call its children through operator() ((*child)(x)), as kolo's own modules do.
/// Forward is collective over `comm`.
class TensorParallelModel {
 public:
  /// Splits `model` as `plan` says. The plan is checked first, on this rank's part: a pattern
  /// that matches no module, a style on a module without what it splits, a size that T does
  /// not divide (naming the path and the shapes), a tensor that two modules share (a tied
  /// embedding and head) split by one and not alike by the other, and a plan that splits no
  /// parameter at all are each an InvalidArgument, and nothing is split. With `stages` (the
  /// pipeline group holding the rest of the model), the last check counts the splits of every
  /// stage, and so does the first when every stage holds the same plan (each stage's own
  /// defaultPlan of a part built alone must match on that part). Collective over `stages`;
  /// none over `comm`.
  TensorParallelModel(std::shared_ptr<nn::Module> model, std::shared_ptr<comm::Communicator> comm,
                      TensorParallelPlan plan, comm::Communicator* stages = nullptr);
  TensorParallelModel(const TensorParallelModel&) = delete;
  TensorParallelModel& operator=(const TensorParallelModel&) = delete;

  /// The split model (the one passed in).
  nn::Module& module() const { return *model_; }
  const std::shared_ptr<nn::Module>& modulePtr() const { return model_; }
  /// (*module())(x): this rank's output (logits split by vocabulary after a vocabularyHead).
  Tensor operator()(const Tensor& x) { return (*model_)(x); }
  Tensor forward(const Tensor& x) { return (*model_)(x); }

  /// The mean cross-entropy of this model's output against targets (class ids, one per row
  /// of the output's last dimension): vocabParallelCrossEntropy when the output is split by
  /// vocabulary, the ordinary cross-entropy otherwise. Collective then.
  Tensor loss(const Tensor& output, const Tensor& targets);
  /// Throws InvalidArgument naming the first split module that no forward has reached
  /// through operator() yet: its transforms never ran, so the numbers would be wrong (a
  /// parent that calls child->forward(x) skips them). With `part`, only the split modules
  /// inside it (a pipeline stage's, by path). loss() checks once, after the first forward,
  /// when the model was split without `stages`; ModelParallelEngine checks its stage after its
  /// first step.
  void requireReached(nn::Module* part = nullptr) const;
  /// Whether forward's output holds V/T of the classes (the plan has a vocabularyHead).
  bool outputSplitByVocabulary() const { return vocabularyOutput_; }
  /// Sums the gradients of the sequence-parallel norms' parameters over the ranks (each
  /// rank's hold its tokens' part). Call after backward (after every micro-batch's) and
  /// before the optimizer steps; nothing to do without sequence parallelism. Collective.
  void synchronizeGradients();

  /// The split of each parameter, by its (whole-model) name; parameters not listed are
  /// replicated.
  const std::map<std::string, ShardSpec>& shardSpecs() const { return specs_; }
  /// Collective: writes every parameter, whole, into `whole` on rank `root` (null elsewhere).
  void gatherInto(nn::Module* whole, int root = 0);
  /// The plan it was split by.
  const TensorParallelPlan& plan() const { return plan_; }
  /// Each module the plan split and the style's name, in tree order.
  const std::vector<std::pair<std::string, std::string>>& splitModules() const { return split_; }
  int tensorParallelSize() const { return comm_->size(); }
  const std::shared_ptr<comm::Communicator>& communicator() const { return comm_; }

 private:
  // A module the plan names, with the index of the entry it takes.
  struct Match {
    std::string path;
    nn::Module* module;
    size_t entry;
  };
  void checkSharedTensors(const std::vector<Match>& matches) const;

  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<comm::Communicator> comm_;
  TensorParallelPlan plan_;
  std::map<std::string, ShardSpec> specs_;
  std::vector<std::pair<std::string, std::string>> split_;
  std::vector<Tensor> sequenceParameters_;
  std::vector<std::pair<std::string, std::shared_ptr<int64_t>>> reached_;
  bool vocabularyOutput_ = false;
  bool reachedChecked_ = false;  // or not to be checked by loss(): a pipeline stage's part
};

}  // namespace kolo::parallel
