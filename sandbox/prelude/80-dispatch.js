// dispatch: the executor's only entry point, and the value of the whole prelude.

// ---- dispatch: the executor's only entry point ---------------------------------------------

// Every command returns ASCII JSON: {ok: ...} or {error: {name, message, limit}}. As a flat
// string: QuickJS makes a long concatenation a rope, which the binding cannot convert (its
// call fails with a TypeError, and the executor stops); a slice of the whole is flat.
return function dispatch(command, argument) {
  return call(strSlice, answerTo(command, argument), 0);
};
function answerTo(command, argument) {
  try {
    switch (command) {
      case "prepare": return prepare();
      case "boot": boot(parseJSON(argument)); return "{}";
      case "load": load(argument); return "{}";
      case "start": start(); return "{}";
      case "next": return nextTurn();
      case "nextTimer": return nextTimerDelay();
      case "fireTimer": fireTimer(); return "{}";
      case "answer": answer(parseJSON(argument)); return "{}";
      case "outcome": return outcomeText();
      case "finish": return ended(finish(), false);
    }
    return asciiJSON({ error: { name: "DriveError", message: "unknown command " + command } });
  } catch (thrown) {
    const limit = limitMessage(thrown);
    const { name, message, stack } = describe(thrown);
    return asciiJSON({ error: { name, message: limit !== null ? limit : message, limit: limit !== null, stack } });
  }
}
