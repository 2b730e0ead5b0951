// The settings registry: defaults, parsing of each type with the messages for bad values,
// where a value came from, and the suggestion for a misspelt KOLO_* variable. Every case
// builds its own Environment, so the process environment does not matter; one case sets
// and unsets a variable in-process to check the accessors that read it.
#include "kolo/settings.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <set>

#include "kolo/error.h"

namespace kolo::settings {
namespace {

Environment envOf(std::map<std::string, std::string> variables) {
  return Environment(std::move(variables));
}

std::string messageOf(const std::function<void()>& action) {
  try {
    action();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

TEST(Settings, EveryDeclarationIsWellFormed) {
  std::set<std::string_view> names;
  for (const Declaration& declaration : declarations()) {
    EXPECT_EQ(declaration.name.rfind("KOLO_", 0), 0u) << declaration.name;
    EXPECT_TRUE(names.insert(declaration.name).second) << declaration.name << " declared twice";
    EXPECT_FALSE(declaration.help.empty()) << declaration.name;
    EXPECT_EQ(find(declaration.name), &declaration);
    EXPECT_EQ(declaration.choices.empty(), declaration.type != Type::Choice) << declaration.name;
    if (declaration.type == Type::Flag || declaration.type == Type::Choice) {
      EXPECT_FALSE(declaration.defaultValue.empty()) << declaration.name << " needs a default";
    }
  }
  // Defaults parse as their own type.
  EXPECT_NO_THROW(envOf({}).validate());
  for (const char* name : {"KOLO_RANK", "KOLO_WORLD_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE",
                           "KOLO_STORE", "KOLO_TOKEN", "KOLO_TIMEOUT", "KOLO_ALGO"})
    EXPECT_NE(find(name), nullptr) << name;
  EXPECT_EQ(find("KOLO_NOPE"), nullptr);
}

TEST(Settings, DefaultsWhenUnsetOrEmpty) {
  for (const Environment& env : {envOf({}), envOf({{"KOLO_ALGO", ""},
                                                              {"KOLO_SMALL_GEMM", ""},
                                                              {"KOLO_RANK", ""}})}) {
    EXPECT_EQ(algo(env), "auto");
    EXPECT_EQ(backend(env), "auto");
    EXPECT_TRUE(smallGemm(env));
    EXPECT_FALSE(checkSignatures(env));
    EXPECT_EQ(rank(env), std::nullopt);
    EXPECT_EQ(timeout(env), std::nullopt);
    EXPECT_EQ(token(env), "");
    EXPECT_EQ(env.source("KOLO_ALGO"), Source::Default);
  }
}

TEST(Settings, ParsesEachType) {
  const Environment env({{"KOLO_ALGO", "ring"},
                         {"KOLO_SMALL_GEMM", "off"},
                         {"KOLO_MPI_BLOCKING", "Yes"},
                         {"KOLO_RANK", "3"},
                         {"KOLO_TIMEOUT", "2.5"},
                         {"KOLO_STORE", "[::1]:29500"},
                         {"KOLO_TOKEN", "s3cret"},
                         {"PATH", "/bin"}});
  EXPECT_EQ(algo(env), "ring");
  EXPECT_EQ(env.source("KOLO_ALGO"), Source::Environment);
  EXPECT_FALSE(smallGemm(env));
  EXPECT_TRUE(mpiBlocking(env));
  EXPECT_EQ(rank(env), 3);
  EXPECT_EQ(timeout(env), 2.5);
  EXPECT_EQ(store(env), "[::1]:29500");
  EXPECT_EQ(token(env), "s3cret");
  EXPECT_NO_THROW(env.validate());
  EXPECT_TRUE(env.unknown().empty());
}

TEST(Settings, BadValuesSayWhatIsAccepted) {
  EXPECT_EQ(messageOf([] { algo(envOf({{"KOLO_ALGO", "fastest"}})); }),
            "KOLO_ALGO='fastest' is not accepted: use one of auto, ring, halving-doubling, tree, "
            "reduce-broadcast, hierarchical");
  EXPECT_EQ(messageOf([] { smallGemm(envOf({{"KOLO_SMALL_GEMM", "maybe"}})); }),
            "KOLO_SMALL_GEMM='maybe' is not a switch: use 1, true, yes or on, or 0, false, no or off");
  EXPECT_EQ(messageOf([] { rank(envOf({{"KOLO_RANK", "1x"}})); }),
            "KOLO_RANK='1x' is not a whole number");
  for (const char* bad : {"-3", "0", "soon", "inf", "1s"}) {
    EXPECT_EQ(messageOf([&] { timeout(envOf({{"KOLO_TIMEOUT", bad}})); }),
              std::string("KOLO_TIMEOUT='") + bad + "' is not a positive number of seconds");
  }
  EXPECT_THROW(envOf({{"KOLO_WORLD_SIZE", "two"}}).validate(), InvalidArgument);
  // problem(): the same message, without throwing; nothing for a good or an unset value.
  const Environment mixed = envOf({{"KOLO_WORLD_SIZE", "two"}, {"KOLO_RANK", "1"}});
  EXPECT_EQ(mixed.problem("KOLO_WORLD_SIZE"), "KOLO_WORLD_SIZE='two' is not a whole number");
  EXPECT_EQ(mixed.problem("KOLO_RANK"), "");
  EXPECT_EQ(mixed.problem("KOLO_TIMEOUT"), "");
  EXPECT_EQ(messageOf([&] { mixed.validate(); }), mixed.problem("KOLO_WORLD_SIZE"));
}

TEST(Settings, ReadingUndeclaredOrAsAnotherTypeIsAnInternalError) {
  const Environment env = envOf({});
  EXPECT_THROW(env.text("KOLO_UNDECLARED"), Error);
  EXPECT_THROW(env.flag("KOLO_ALGO"), Error);
  EXPECT_THROW(env.integer("KOLO_ALGO"), Error);
}

TEST(Settings, UnknownVariablesGetTheClosestName) {
  const Environment env({{"KOLO_ALOG", "ring"},
                         {"KOLO_WORLDSIZE", "2"},
                         {"KOLO_COMPLETELY_DIFFERENT", "1"},
                         {"KOLO_BENCH_ARGS", "--iters 5"},
                         {"KOLO_ALGO", "ring"},
                         {"NOT_KOLO", "1"}});
  EXPECT_EQ(env.unknown(),
            (std::vector<std::string>{"KOLO_ALOG", "KOLO_COMPLETELY_DIFFERENT", "KOLO_WORLDSIZE"}));
  EXPECT_EQ(closestName("KOLO_ALOG"), "KOLO_ALGO");
  EXPECT_EQ(closestName("KOLO_WORLDSIZE"), "KOLO_WORLD_SIZE");
  EXPECT_EQ(closestName("kolo_timout"), "KOLO_TIMEOUT");
  EXPECT_EQ(closestName("KOLO_COMPLETELY_DIFFERENT"), "");
  const std::vector<std::string> lines = unknownVariableWarnings(env);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "KOLO_ALOG is not a kolo setting (did you mean KOLO_ALGO? `kolo env` lists them)");
  EXPECT_EQ(lines[1], "KOLO_COMPLETELY_DIFFERENT is not a kolo setting (`kolo env` lists them)");
}

// The listing `kolo env` prints: one line a declaration with its value and source, a secret
// hidden, a bad value followed by why; the help only when asked for.
TEST(Settings, TheListingShowsValuesSourcesAndProblems) {
  const Environment env({{"KOLO_ALGO", "ring"}, {"KOLO_TOKEN", "s3cret"}, {"KOLO_TIMEOUT", "soon"}});
  const std::string full = listing(env);
  const std::string brief = listing(env, false);
  const auto lineOf = [](const std::string& text, const std::string& name) {
    const size_t at = text.find(name + " ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  EXPECT_NE(lineOf(brief, "KOLO_ALGO").find(" ring "), std::string::npos) << brief;
  EXPECT_NE(lineOf(brief, "KOLO_ALGO").find("environment"), std::string::npos) << brief;
  EXPECT_NE(lineOf(brief, "KOLO_TOKEN").find("(set, hidden)"), std::string::npos) << brief;
  EXPECT_EQ(brief.find("s3cret"), std::string::npos) << brief;
  EXPECT_NE(lineOf(brief, "KOLO_RANK").find("(unset)"), std::string::npos) << brief;
  EXPECT_NE(lineOf(brief, "KOLO_RANK").find("default"), std::string::npos) << brief;
  EXPECT_NE(brief.find("\n  ^ not accepted: KOLO_TIMEOUT"), std::string::npos) << brief;
  EXPECT_NE(lineOf(full, "KOLO_ALGO").find("[auto ring halving-doubling"), std::string::npos) << full;
  EXPECT_EQ(lineOf(brief, "KOLO_ALGO").find("[auto"), std::string::npos) << brief;
}

TEST(Settings, AccessorsReadTheProcessEnvironment) {
  ::setenv("KOLO_ALGO", "tree", 1);
  EXPECT_EQ(algo(), "tree");
  EXPECT_EQ(Environment::process().source("KOLO_ALGO"), Source::Environment);
  ::unsetenv("KOLO_ALGO");
  EXPECT_EQ(algo(), "auto");
}

}  // namespace
}  // namespace kolo::settings
