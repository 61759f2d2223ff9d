// A throttled re-fetch with an in-flight guard: request() asks for a run of `task`; runs start
// at most once per `intervalMs`, never two at once, and requests that arrive during a run or
// the wait fold into one run after it.
export class Refresher {
  constructor(task, intervalMs, { now = () => performance.now(),
                                  setTimer = (fn, ms) => setTimeout(fn, ms),
                                  clearTimer = (t) => clearTimeout(t), onError = null } = {}) {
    this.task = task;
    this.interval = intervalMs;
    this.now = now;
    this.setTimer = setTimer;
    this.clearTimer = clearTimer;
    this.onError = onError;
    this.last = -Infinity;
    this.pending = false;
    this.urgent = false;
    this.inFlight = null;
    this.timer = null;
    this.stopped = false;
    this.runs = 0;
  }

  request() {
    this.pending = true;
    this.schedule();
  }

  // Runs now (ignoring the interval) unless a run is in flight, which is then followed at once
  // by one more; returns a promise of the run (the one in flight, if any).
  flush() {
    this.pending = true;
    this.urgent = true;
    if (this.timer !== null) {
      this.clearTimer(this.timer);
      this.timer = null;
    }
    if (this.inFlight) return this.inFlight;
    return this.run();
  }

  schedule() {
    if (this.stopped || this.inFlight || this.timer !== null || !this.pending) return;
    const wait = this.urgent ? 0 : Math.max(0, this.last + this.interval - this.now());
    this.timer = this.setTimer(() => {
      this.timer = null;
      this.run();
    }, wait);
  }

  run() {
    if (this.stopped || this.inFlight) return this.inFlight || Promise.resolve();
    this.pending = false;
    this.urgent = false;
    this.last = this.now();
    this.runs += 1;
    this.inFlight = (async () => {
      try {
        await this.task();
      } catch (e) {
        if (this.onError) this.onError(e);
      } finally {
        this.inFlight = null;
        this.schedule();
      }
    })();
    return this.inFlight;
  }

  stop() {
    this.stopped = true;
    if (this.timer !== null) this.clearTimer(this.timer);
    this.timer = null;
  }
}
