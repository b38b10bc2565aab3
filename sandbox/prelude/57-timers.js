// setTimeout, setInterval and their clears: real timers bounded by the drive. Each timer is due
// on a timer clock of the drive's own (delays add up from 0, ties fire in the order they were
// set, so the order never depends on the machine); when nothing else is left to do, the
// executor sleeps until the next one is due, within the drive's wall-clock budget, and fires
// it in the step scope that set it.

const timers = []; // {id, due, seq, callback, args, every, scope}, unsorted: few at a time
let timerClock = 0;
let timerSeq = 0;
let nextTimerId = 1;

function timerDelay(delay) {
  const ms = +delay;
  return ms > 0 && ms === ms ? Math.floor(ms) : 0;
}
function addTimer(callback, delay, args, repeat, internal) {
  if (typeof callback !== "function") {
    throw new RealTypeError("setTimeout and setInterval take a function (not code as a string)");
  }
  if (timers.length >= MAX_TIMERS) throw new LimitError(`more than ${MAX_TIMERS} timers at once`);
  const ms = timerDelay(delay);
  const id = nextTimerId++;
  append(timers, {
    id, due: timerClock + ms, seq: timerSeq++, callback, args, every: repeat ? (ms || 1) : 0,
    scope: currentScope, internal: internal === true,
  });
  return id;
}
function clearTimer(id) {
  for (let i = 0; i < timers.length; i++) {
    if (timers[i].id === id) {
      timers.splice(i, 1);
      return;
    }
  }
}
const MAX_TIMERS = 1000;
// What author code reaches, as the Web's are: plain methods (no `prototype`, so `new
// setTimeout()` is a TypeError, and the lockdown has no prototype of theirs to make and freeze).
const timerFunctions = {
  setTimeout(callback, delay, ...args) {
    return addTimer(callback, delay, args, false);
  },
  setInterval(callback, delay, ...args) {
    return addTimer(callback, delay, args, true);
  },
  clearTimeout(id) {
    clearTimer(id);
  },
  clearInterval(id) {
    clearTimer(id);
  },
};
function earliestTimer() {
  let first = -1;
  for (let i = 0; i < timers.length; i++) {
    const timer = timers[i];
    if (first < 0 || timer.due < timers[first].due || (timer.due === timers[first].due && timer.seq < timers[first].seq)) {
      first = i;
    }
  }
  return first;
}
// "ms" until the next timer is due ("ms,retry" for a step's in-drive retry, which the
// executor may leave to a later drive), or "-1" when none is set.
function nextTimerDelay() {
  const first = earliestTimer();
  if (first < 0) return "-1";
  const delay = timers[first].due - timerClock;
  return timers[first].internal ? `${delay},retry` : `${delay}`;
}
function fireTimer() {
  const first = earliestTimer();
  if (first < 0) return;
  const timer = timers[first];
  timerClock = timer.due;
  if (timer.every > 0) {
    timer.due = timerClock + timer.every;
    timer.seq = timerSeq++;
  } else {
    timers.splice(first, 1);
  }
  const saved = currentScope;
  currentScope = timer.scope;
  try {
    apply(timer.callback, undefined, timer.args);
  } finally {
    currentScope = saved;
  }
}
