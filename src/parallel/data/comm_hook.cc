// The two Work shapes that communication hooks return: one already complete, and one that
// finishes a hook's computation after its first collective lands.
#include "kolo/parallel/comm_hook.h"

namespace kolo::parallel {
namespace {

class CompletedWork final : public comm::Work {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool test() override { return true; }
};

class ThenWork final : public comm::Work {
 public:
  ThenWork(std::unique_ptr<comm::Work> first, std::function<void()> then)
      : first_(std::move(first)), then_(std::move(then)) {}
  void wait(std::chrono::milliseconds timeout) override {
    if (done_) return;
    if (first_) first_->wait(timeout);
    done_ = true;  // a throwing continuation is not run twice
    if (then_) then_();
  }
  // Complete only once the continuation ran: test() must not run it (it may block).
  bool test() override { return done_; }

 private:
  std::unique_ptr<comm::Work> first_;
  std::function<void()> then_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<comm::Work> completedWork() { return std::make_unique<CompletedWork>(); }

std::unique_ptr<comm::Work> thenWork(std::unique_ptr<comm::Work> first,
                                     std::function<void()> then) {
  return std::make_unique<ThenWork>(std::move(first), std::move(then));
}

}  // namespace kolo::parallel
