// The only script: a button pressed once stays disabled until its page answers.
// The page works without it; the intent key makes a second submission harmless anyway.
document.addEventListener("submit", function (event) {
  var form = event.target;
  if (form.dataset.pending === "1") { event.preventDefault(); return; }
  form.dataset.pending = "1";
  var buttons = form.querySelectorAll("button");
  for (var i = 0; i < buttons.length; i++) { buttons[i].disabled = true; buttons[i].textContent += "…"; }
});
