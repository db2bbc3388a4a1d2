// The one ordering gRPC's callback API promises a reactor, told to
// ThreadSanitizer: every reaction (OnReadDone, OnWriteDone, OnCancel, ...)
// has returned before OnDone runs. gRPC keeps that promise with a counter of
// outstanding callbacks and an executor that runs OnDone on another thread,
// both in uninstrumented Debian libraries, so TSan sees no order between a
// reaction on a poller thread and the OnDone (usually `delete this`) on an
// executor thread, and reports the reactor's own fields as racing with its
// destruction.
//
// Each reaction opens a `ReactionScope` first; it releases the reactor's
// address when the reaction returns. OnDone calls `AfterAllReactions` first;
// it acquires that address. The second promise: an operation started with
// StartRead / StartWrite completes in its reaction after the start
// (`BeforeStart` before the call, the same tag in the reaction's scope).
// Nothing else is ordered: reactions that gRPC may run at the same time (a
// bidi stream's OnReadDone and OnWriteDone, OnCancel and either) still look
// concurrent to TSan, and races between them are still reported. Outside
// TSan builds all of it compiles to nothing.
#ifndef SHOAL_COMMON_REACTOR_HANDOFF_H_
#define SHOAL_COMMON_REACTOR_HANDOFF_H_

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define SHOAL_TSAN_ENABLED 1
#endif

namespace shoal {

// Right before StartRead(buffer) / StartWrite(buffer): what this thread
// wrote (the message, the reactor's state) happens before the reaction
// that completes the operation (gRPC's order of an operation and its
// reaction, kept inside its uninstrumented libraries). `buffer` is the
// operation's tag: the reaction names the same one.
inline void BeforeStart([[maybe_unused]] const void* buffer) {
#ifdef SHOAL_TSAN_ENABLED
  __tsan_release(const_cast<void*>(buffer));
#endif
}

class ReactionScope {
 public:
  // `buffer`: for OnReadDone / OnWriteDone, the tag its StartRead /
  // StartWrite was given to BeforeStart.
  explicit ReactionScope(const void* reactor, [[maybe_unused]] const void* buffer = nullptr)
      : reactor_(const_cast<void*>(reactor)) {
#ifdef SHOAL_TSAN_ENABLED
    if (buffer != nullptr) __tsan_acquire(const_cast<void*>(buffer));
#endif
  }
  ~ReactionScope() {
#ifdef SHOAL_TSAN_ENABLED
    __tsan_release(reactor_);
#endif
  }
  ReactionScope(const ReactionScope&) = delete;
  ReactionScope& operator=(const ReactionScope&) = delete;

 private:
  [[maybe_unused]] void* reactor_;
};

// First thing in OnDone: everything the reactions did happens before.
inline void AfterAllReactions([[maybe_unused]] const void* reactor) {
#ifdef SHOAL_TSAN_ENABLED
  __tsan_acquire(const_cast<void*>(reactor));
#endif
}

}  // namespace shoal

#endif  // SHOAL_COMMON_REACTOR_HANDOFF_H_
