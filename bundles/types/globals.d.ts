// Globals a workflow sees besides the ECMAScript built-ins. There are no timers (use
// step.sleep), no fetch (use step.tool) and no file system. Date and Math.random are
// deterministic: they replay with the values the first execution saw.
interface QjsflowConsole {
  log(...data: unknown[]): void;
  info(...data: unknown[]): void;
  warn(...data: unknown[]): void;
  error(...data: unknown[]): void;
  debug(...data: unknown[]): void;
}
declare var console: QjsflowConsole;
