// ThreadSanitizer builds only (SHOAL_SANITIZE=thread): tells TSan about the
// locks of Debian's Abseil.
//
// Debian's libabsl_synchronization is not instrumented, and absl::Mutex is
// built on its own atomics and futexes, which TSan does not intercept (it
// does intercept pthread_mutex). Every ABSL_GUARDED_BY field of Shoal, and
// every hand-off inside gRPC (whose gpr_mu and grpc_core::Mutex are
// absl::Mutex), would then look like a data race. This file defines, in the
// executable, the public entry points of absl::Mutex, absl::CondVar and
// absl::Notification: each one calls the library's own function (found with
// dlsym(RTLD_NEXT)) and adds the happens-before edge the lock gives
// (__tsan_release before an unlock, __tsan_acquire after a lock). The
// executable exports these symbols (CMake: --export-dynamic-symbol), so calls
// from gRPC go through them too.
//
// Only happens-before is modelled, not lock ownership: TSan still finds
// unsynchronised accesses, but not lock-order inversions on absl::Mutex, nor
// races inside a Condition's function (see Call below).
// The symbols are the mangled names of absl 20220623 as Debian builds it
// (inline namespace `debian3`); a missing one aborts at its first call with
// its name.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();

namespace {

// absl::Duration and absl::Time by value: a 16-byte trivially copyable
// struct (int64 + uint32), passed in two registers like the real ones.
struct Duration {
  int64_t hi;
  uint32_t lo;
};
struct Time {
  Duration rep;
};

// Calls `fn` with TSan ignoring this thread's memory accesses: inside Abseil
// they are uninstrumented anyway, but Mutex runs the callers' Conditions
// there, in whichever thread happens to hold the lock (the waiter on entry,
// or the thread that unlocks), and those reads of guarded fields would be
// unordered with the next owner's writes.
template <typename Fn, typename... Args>
auto Call(Fn fn, Args... args) {
  struct Ignore {
    Ignore() { __tsan_ignore_thread_begin(); }
    ~Ignore() { __tsan_ignore_thread_end(); }
  } ignore;
  return fn(args...);
}

// The library's definition of `name`, looked up once.
void* Real(std::atomic<void*>& slot, const char* name) {
  void* fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = dlsym(RTLD_NEXT, name);
    if (fn == nullptr) {
      std::fprintf(stderr, "tsan_absl_sync: %s not found in Abseil\n", name);
      std::abort();
    }
    slot.store(fn, std::memory_order_release);
  }
  return fn;
}

}  // namespace

// Inside a wrapper: `real`, the library's function `mangled` of type `type`.
#define SHOAL_REAL(type, mangled)          \
  static std::atomic<void*> slot{nullptr}; \
  auto real = reinterpret_cast<type>(Real(slot, mangled))

// ---- absl::Mutex ----------------------------------------------------------
// A Mutex is one word; its address is the synchronisation object.

extern "C" void ShoalMutexLock(void* mu) __asm__("_ZN4absl7debian35Mutex4LockEv");
extern "C" void ShoalMutexLock(void* mu) {
  SHOAL_REAL(void (*)(void*), "_ZN4absl7debian35Mutex4LockEv");
  Call(real, mu);
  __tsan_acquire(mu);
}

extern "C" void ShoalMutexReaderLock(void* mu) __asm__("_ZN4absl7debian35Mutex10ReaderLockEv");
extern "C" void ShoalMutexReaderLock(void* mu) {
  SHOAL_REAL(void (*)(void*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  Call(real, mu);
  __tsan_acquire(mu);
}

extern "C" void ShoalMutexUnlock(void* mu) __asm__("_ZN4absl7debian35Mutex6UnlockEv");
extern "C" void ShoalMutexUnlock(void* mu) {
  SHOAL_REAL(void (*)(void*), "_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_release(mu);
  Call(real, mu);
}

extern "C" void ShoalMutexReaderUnlock(void* mu) __asm__("_ZN4absl7debian35Mutex12ReaderUnlockEv");
extern "C" void ShoalMutexReaderUnlock(void* mu) {
  SHOAL_REAL(void (*)(void*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_release(mu);
  Call(real, mu);
}

extern "C" bool ShoalMutexTryLock(void* mu) __asm__("_ZN4absl7debian35Mutex7TryLockEv");
extern "C" bool ShoalMutexTryLock(void* mu) {
  SHOAL_REAL(bool (*)(void*), "_ZN4absl7debian35Mutex7TryLockEv");
  bool r = Call(real, mu);
  if (r) __tsan_acquire(mu);
  return r;
}

extern "C" bool ShoalMutexReaderTryLock(void* mu) __asm__(
    "_ZN4absl7debian35Mutex13ReaderTryLockEv");
extern "C" bool ShoalMutexReaderTryLock(void* mu) {
  SHOAL_REAL(bool (*)(void*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  bool r = Call(real, mu);
  if (r) __tsan_acquire(mu);
  return r;
}

// LockWhen*: returns holding the lock (also on timeout).
extern "C" void ShoalMutexLockWhen(void* mu, const void* cond) __asm__(
    "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
extern "C" void ShoalMutexLockWhen(void* mu, const void* cond) {
  SHOAL_REAL(void (*)(void*, const void*), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  Call(real, mu, cond);
  __tsan_acquire(mu);
}

extern "C" void ShoalMutexReaderLockWhen(void* mu, const void* cond) __asm__(
    "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
extern "C" void ShoalMutexReaderLockWhen(void* mu, const void* cond) {
  SHOAL_REAL(void (*)(void*, const void*),
             "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Call(real, mu, cond);
  __tsan_acquire(mu);
}

extern "C" bool ShoalMutexLockWhenWithTimeout(void* mu, const void* cond, Duration d) __asm__(
    "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
extern "C" bool ShoalMutexLockWhenWithTimeout(void* mu, const void* cond, Duration d) {
  SHOAL_REAL(bool (*)(void*, const void*, Duration),
             "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  bool r = Call(real, mu, cond, d);
  __tsan_acquire(mu);
  return r;
}

extern "C" bool ShoalMutexReaderLockWhenWithTimeout(void* mu, const void* cond, Duration d) __asm__(
    "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
extern "C" bool ShoalMutexReaderLockWhenWithTimeout(void* mu, const void* cond, Duration d) {
  SHOAL_REAL(bool (*)(void*, const void*, Duration),
             "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  bool r = Call(real, mu, cond, d);
  __tsan_acquire(mu);
  return r;
}

extern "C" bool ShoalMutexLockWhenWithDeadline(void* mu, const void* cond, Time t) __asm__(
    "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
extern "C" bool ShoalMutexLockWhenWithDeadline(void* mu, const void* cond, Time t) {
  SHOAL_REAL(bool (*)(void*, const void*, Time),
             "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  bool r = Call(real, mu, cond, t);
  __tsan_acquire(mu);
  return r;
}

extern "C" bool ShoalMutexReaderLockWhenWithDeadline(void* mu, const void* cond, Time t) __asm__(
    "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
extern "C" bool ShoalMutexReaderLockWhenWithDeadline(void* mu, const void* cond, Time t) {
  SHOAL_REAL(bool (*)(void*, const void*, Time),
             "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  bool r = Call(real, mu, cond, t);
  __tsan_acquire(mu);
  return r;
}

// Await*: releases the lock while it waits, holds it again on return.
extern "C" void ShoalMutexAwait(void* mu, const void* cond) __asm__(
    "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
extern "C" void ShoalMutexAwait(void* mu, const void* cond) {
  SHOAL_REAL(void (*)(void*, const void*), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(mu);
  Call(real, mu, cond);
  __tsan_acquire(mu);
}

extern "C" bool ShoalMutexAwaitWithTimeout(void* mu, const void* cond, Duration d) __asm__(
    "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
extern "C" bool ShoalMutexAwaitWithTimeout(void* mu, const void* cond, Duration d) {
  SHOAL_REAL(bool (*)(void*, const void*, Duration),
             "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(mu);
  bool r = Call(real, mu, cond, d);
  __tsan_acquire(mu);
  return r;
}

extern "C" bool ShoalMutexAwaitWithDeadline(void* mu, const void* cond, Time t) __asm__(
    "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
extern "C" bool ShoalMutexAwaitWithDeadline(void* mu, const void* cond, Time t) {
  SHOAL_REAL(bool (*)(void*, const void*, Time),
             "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(mu);
  bool r = Call(real, mu, cond, t);
  __tsan_acquire(mu);
  return r;
}

// ---- absl::CondVar: Wait* releases `mu` and holds it again on return ------

extern "C" void ShoalCondVarWait(void* cv,
                                 void* mu) __asm__("_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
extern "C" void ShoalCondVarWait(void* cv, void* mu) {
  SHOAL_REAL(void (*)(void*, void*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  Call(real, cv, mu);
  __tsan_acquire(mu);
}

extern "C" bool ShoalCondVarWaitWithTimeout(void* cv, void* mu, Duration d) __asm__(
    "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
extern "C" bool ShoalCondVarWaitWithTimeout(void* cv, void* mu, Duration d) {
  SHOAL_REAL(bool (*)(void*, void*, Duration),
             "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  bool r = Call(real, cv, mu, d);
  __tsan_acquire(mu);
  return r;
}

extern "C" bool ShoalCondVarWaitWithDeadline(void* cv, void* mu, Time t) __asm__(
    "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
extern "C" bool ShoalCondVarWaitWithDeadline(void* cv, void* mu, Time t) {
  SHOAL_REAL(bool (*)(void*, void*, Time),
             "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  bool r = Call(real, cv, mu, t);
  __tsan_acquire(mu);
  return r;
}

// ---- absl::Notification ---------------------------------------------------
// Layout: { Mutex mutex_; std::atomic<bool> notified_yet_; }. The inline
// HasBeenNotified() is an instrumented acquire load of notified_yet_, so
// Notify() releases on that address as well as on the object.

namespace {
void* NotifiedYet(const void* n) {
  return static_cast<char*>(const_cast<void*>(n)) + sizeof(void*);
}
}  // namespace

extern "C" void ShoalNotificationNotify(void* n) __asm__("_ZN4absl7debian312Notification6NotifyEv");
extern "C" void ShoalNotificationNotify(void* n) {
  SHOAL_REAL(void (*)(void*), "_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(n);
  __tsan_release(NotifiedYet(n));
  Call(real, n);
}

extern "C" void ShoalNotificationWait(const void* n) __asm__(
    "_ZNK4absl7debian312Notification19WaitForNotificationEv");
extern "C" void ShoalNotificationWait(const void* n) {
  SHOAL_REAL(void (*)(const void*), "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  Call(real, n);
  __tsan_acquire(const_cast<void*>(n));
}

extern "C" bool ShoalNotificationWaitWithTimeout(const void* n, Duration d) __asm__(
    "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
extern "C" bool ShoalNotificationWaitWithTimeout(const void* n, Duration d) {
  SHOAL_REAL(bool (*)(const void*, Duration),
             "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  bool r = Call(real, n, d);
  if (r) __tsan_acquire(const_cast<void*>(n));
  return r;
}

extern "C" bool ShoalNotificationWaitWithDeadline(const void* n, Time t) __asm__(
    "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
extern "C" bool ShoalNotificationWaitWithDeadline(const void* n, Time t) {
  SHOAL_REAL(bool (*)(const void*, Time),
             "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  bool r = Call(real, n, t);
  if (r) __tsan_acquire(const_cast<void*>(n));
  return r;
}
