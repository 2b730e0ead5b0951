// The settings registry: every KOLO_* environment variable kolo reads, declared once in
// KOLO_SETTINGS (name, type, default, one line of help) in the manner of NCCL's NCCL_PARAM,
// parsed here and nowhere else, and listed by `kolo env`.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

/// Every KOLO_* variable: X(accessor, NAME, Type, default, choices, help). An empty default
/// means unset; `choices` ("a|b|c") lists what a Choice accepts. The variables that `kolo
/// run` sets for its ranks come first; flags of `kolo train` and `kolo run` override the rest.
#define KOLO_SETTINGS(X)                                                                          \
  X(rank, "KOLO_RANK", Integer, "", "", "this process's rank in the job (set by kolo run)")        \
  X(worldSize, "KOLO_WORLD_SIZE", Integer, "", "", "ranks in the job (set by kolo run)")           \
  X(localRank, "KOLO_LOCAL_RANK", Integer, "", "", "rank among this node's ranks (set by kolo run)") \
  X(localSize, "KOLO_LOCAL_SIZE", Integer, "", "", "ranks on this node (set by kolo run)")         \
  X(nodeRank, "KOLO_NODE_RANK", Integer, "", "", "this node's index in the job (set by kolo run)") \
  X(nnodes, "KOLO_NNODES", Integer, "", "", "nodes in the job (set by kolo run)")                 \
  X(store, "KOLO_STORE", Text, "", "", "HOST:PORT of the job's rendezvous store (set by kolo run)") \
  X(token, "KOLO_TOKEN", Secret, "", "",                                                          \
    "the job's shared secret, required by the store; set it on every node of a multi-node job")  \
  X(storePort, "KOLO_STORE_PORT", Integer, "", "",                                               \
    "under srun: the port of the store rank 0 hosts on the step's first node (unset: MASTER_PORT, else derived from the job and step ids)") \
  X(role, "KOLO_ROLE", Text, "", "",                                                               \
    "parameter-server jobs: this process's role, ps, worker or chief (set by kolo run --ps)")   \
  X(roleIndex, "KOLO_ROLE_INDEX", Integer, "", "",                                                \
    "parameter-server jobs: this process's index among its role (set by kolo run --ps)")        \
  X(psServers, "KOLO_PS_SERVERS", Integer, "", "",                                                \
    "parameter-server jobs: the number of servers P (set by kolo run --ps)")                    \
  X(psWorkers, "KOLO_PS_WORKERS", Integer, "", "",                                                \
    "parameter-server jobs: the number of workers W (set by kolo run --workers)")               \
  X(elasticMinRanks, "KOLO_ELASTIC_MIN_RANKS", Integer, "", "",                                  \
    "elastic jobs: the fewest ranks the job may shrink to (set by kolo run --elastic --min-ranks)") \
  X(elasticMaxRanks, "KOLO_ELASTIC_MAX_RANKS", Integer, "", "",                                  \
    "elastic jobs: the most ranks a generation may have (set by kolo run --elastic --max-ranks)") \
  X(elasticJoin, "KOLO_ELASTIC_JOIN", Flag, "0", "",                                              \
    "elastic jobs: this rank was started in a lost one's place and joins the running job (set by kolo run --elastic)") \
  X(timeout, "KOLO_TIMEOUT", Seconds, "", "",                                                     \
    "seconds before a collective or the rendezvous gives up (unset: the program's own, 300)")    \
  X(backend, "KOLO_BACKEND", Choice, "auto", "auto|native|mpi",                                   \
    "communicator backend; auto: MPI under mpirun when built with it, else native (srun too)")   \
  X(algo, "KOLO_ALGO", Choice, "auto", "auto|ring|halving-doubling|tree|reduce-broadcast|hierarchical", \
    "all-reduce algorithm of every communicator; auto: chosen by message size and topology")     \
  X(checkSignatures, "KOLO_CHECK_SIGNATURES", Flag, "0", "",                                      \
    "MPI backend: ranks compare each collective's signature before running it")                  \
  X(mpiBlocking, "KOLO_MPI_BLOCKING", Flag, "0", "",                                              \
    "MPI backend: blocking collectives call MPI's blocking functions (no deadline)")             \
  X(smallGemm, "KOLO_SMALL_GEMM", Flag, "1", "",                                                  \
    "AVX-512 kernels for small f32 matrix products; 0: OpenBLAS for every product")                 \
  X(hugePages, "KOLO_HUGE_PAGES", Flag, "1", "",                                                  \
    "kolo run: ranks start with glibc's malloc on transparent huge pages (adds glibc.malloc.hugetlb=1 to GLIBC_TUNABLES unless it names hugetlb); 0: GLIBC_TUNABLES as it is") \
  X(timeline, "KOLO_TIMELINE", Text, "", "",                                                       \
    "directory: every rank records a timeline, merged into DIR/trace.json (Chrome trace)")      \
  X(debugDir, "KOLO_DEBUG_DIR", Text, "", "",                                                      \
    "directory of the flight recorder's rings and dumps (set by kolo run --debug-dir)")         \
  X(flightRecorder, "KOLO_FLIGHT_RECORDER", Integer, "1024", "",                                  \
    "collectives the flight recorder keeps per rank; 0: off")                                      \
  X(statusFile, "KOLO_STATUS_FILE", Text, "", "",                                                 \
    "fit, the parameter servers and federated training: each process keeps its step and state in FILE.rank-N (set by kolo run --status-file; read by kolo status FILE)")

namespace kolo::settings {

/// How a setting's text is read. Flag: 1/true/yes/on or 0/false/no/off. Integer: a whole
/// number. Seconds: a positive number. Choice: one of the declared choices. Text: as is.
/// Secret: as is, but `kolo env` shows only whether it is set.
enum class Type { Flag, Integer, Seconds, Choice, Text, Secret };

/// One declared variable (an entry of KOLO_SETTINGS).
struct Declaration {
  std::string_view name;
  Type type;
  std::string_view defaultValue;  // empty: unset by default
  std::string_view choices;       // Choice only: "a|b|c"
  std::string_view help;
};

/// Every declaration, in the order of KOLO_SETTINGS.
std::span<const Declaration> declarations();

/// The declaration called `name`, or nullptr.
const Declaration* find(std::string_view name);

/// "flag", "integer", "seconds", "choice", "text" or "secret".
const char* typeName(Type type);

/// Where a setting's value came from.
enum class Source { Default, Environment };

/// A copy of a set of environment variables, read against the registry. Values are parsed
/// when asked for; a value that does not parse throws kolo::InvalidArgument naming the
/// variable, the value and what is accepted. An empty variable counts as unset.
class Environment {
 public:
  explicit Environment(std::map<std::string, std::string> variables);

  /// This process's environment, copied now (the one place kolo reads `environ`).
  static Environment process();

  /// Every variable of this environment, KOLO_* or not.
  const std::map<std::string, std::string>& variables() const { return variables_; }
  /// The variable `name` (declared or not) when set and not empty, else nullptr.
  const std::string* find(const std::string& name) const;

  /// Environment when the declared variable `name` is set (not empty), else Default.
  Source source(std::string_view name) const;
  /// The declared variable's text: its value when set, else its default (maybe empty).
  std::string text(std::string_view name) const;
  /// A Flag's value. Throws InvalidArgument for other words.
  bool flag(std::string_view name) const;
  /// An Integer's value; nullopt when unset without default.
  std::optional<int64_t> integer(std::string_view name) const;
  /// A Seconds setting's value, positive and finite; nullopt when unset without default.
  std::optional<double> seconds(std::string_view name) const;
  /// A Choice's value, one of its choices.
  std::string choice(std::string_view name) const;

  /// Why the declared variable's text (its value, else its default) does not parse as its
  /// type: the message validate() would throw; "" when it parses or is empty.
  std::string problem(std::string_view name) const;
  /// Parses every declared variable that is set; throws the first problem found.
  void validate() const;
  /// The KOLO_* variables set here that no declaration names, sorted.
  std::vector<std::string> unknown() const;

 private:
  const Declaration& declared(std::string_view name, Type type) const;
  std::map<std::string, std::string> variables_;
};

/// The declared name nearest to `name` by edit distance, or "" when none is close
/// (more than a third of the name's letters, and more than 2, would have to change).
std::string closestName(std::string_view name);

/// One line per unknown KOLO_* variable of `env`: "KOLO_ALOG is not a kolo setting (did you
/// mean KOLO_ALGO? `kolo env` lists them)".
std::vector<std::string> unknownVariableWarnings(const Environment& env);

/// Every declared setting, one line each, as `kolo env` prints it: name, value in `env`
/// ("(unset)", "(set, hidden)" for a secret, a flag as 1 or 0), where it came from
/// ("environment" or "default"), with `help` its help and choices; a value that does not
/// parse is followed by a line "  ^ not accepted: WHY".
std::string listing(const Environment& env, bool help = true);

// The typed accessors, one per declaration (NCCL_PARAM's ncclParamX()): read the process
// environment unless given one. Flag -> bool; Integer -> optional<int64_t>; Seconds ->
// optional<double>; Choice, Text, Secret -> std::string (empty when unset).
template <Type>
struct ValueOf;
template <>
struct ValueOf<Type::Flag> {
  using type = bool;
};
template <>
struct ValueOf<Type::Integer> {
  using type = std::optional<int64_t>;
};
template <>
struct ValueOf<Type::Seconds> {
  using type = std::optional<double>;
};
template <>
struct ValueOf<Type::Choice> {
  using type = std::string;
};
template <>
struct ValueOf<Type::Text> {
  using type = std::string;
};
template <>
struct ValueOf<Type::Secret> {
  using type = std::string;
};

#define KOLO_SETTING_ACCESSOR_(accessor, name, kind, ...)     \
  ValueOf<Type::kind>::type accessor(const Environment& env); \
  inline ValueOf<Type::kind>::type accessor() { return accessor(Environment::process()); }
KOLO_SETTINGS(KOLO_SETTING_ACCESSOR_)
#undef KOLO_SETTING_ACCESSOR_

}  // namespace kolo::settings
